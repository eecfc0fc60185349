"""What the benchmark scripts share, in one module (no script imports another; ``suite.py`` runs them): the
machine a figure was measured on; how runs are compared (rounds that rotate the variants, a steady step, paired
differences, each thread's CPU time); and the simulated GPU's helpers (the floor design, the in-place meter around
perfhooks' entry points, one torch thread, perfhooks bound to the simulation)."""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any
from unittest import mock

import torch


def machine_info() -> dict[str, Any]:
    from perfhooks.device.describe import cpu_model

    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    versions = {}
    for package in ("perfhooks", "torch", "lightning", "transformers", "accelerate", "wandb", "nvtx",
                    "HolisticTraceAnalysis", "torch-tb-profiler", "orjson", "msgspec", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {"hostname": socket.gethostname(), "cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu,
            "python": sys.version.split()[0], "platform": platform.platform(), "versions": versions}


def describe_machine() -> str:
    info = machine_info()
    return (f"{info['cpu']}, {info['cores']} cores, {info['gpu'] or 'no GPU'}, Python {info['python']}, "
            f"torch {info['versions'].get('torch', '?')}")


class Floor:
    """The least a design can do at a plain loop's six step boundaries (the fetch's start and end, the forward's
    start and end, the optimizer step's start and end, through the same torch hooks perfhooks uses): take the host
    time and append it; with ``device``, also record a pooled event on the current stream found by its id, and ask
    once a step whether the stream captures (the device calls perfhooks makes on the training thread)."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, device: bool) -> None:
        self.log: list[Any] = []
        self.pool: list[Any] = []
        self.streams: dict[Any, Any] = {}
        self.device = device
        self.handles = [model.register_forward_pre_hook(lambda _module, _args: self.mark()),
                        model.register_forward_hook(lambda _module, _args, _output: self.mark()),
                        optimizer.register_step_pre_hook(lambda *_: self.mark()),
                        optimizer.register_step_post_hook(lambda *_: self.mark())]

    def remove(self) -> None:
        """Take its hooks off the model and the optimizer (a model shared between runs)."""
        for handle in self.handles:
            handle.remove()

    def mark(self) -> None:
        if self.device:
            event = self.pool.pop() if self.pool else torch.cuda.Event(enable_timing=True)
            key = torch._C._cuda_getCurrentStream(0)
            stream = self.streams.get(key)
            if stream is None:
                stream = self.streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                                               device_type=key[2])
            event.record(stream)
            self.log.append((time.perf_counter_ns(), event))
        else:
            self.log.append(time.perf_counter_ns())
        if len(self.log) >= 64:
            if self.device:
                self.pool.extend(event for _, event in self.log)
            self.log.clear()

    def __enter__(self) -> None:
        if self.device:
            torch.cuda.is_current_stream_capturing()
        self.mark()

    def __exit__(self, *_exc: object) -> None:
        self.mark()


#: perfhooks.profile's entry points from the loop and torch's hooks: a step's host time inside perfhooks is spent
#: in these (each timed in place by :func:`in_place`).
ENTRY_POINTS = (("DataWait", "__enter__"), ("DataWait", "__exit__"), ("ProfiledLoop", "_forward_start"),
                ("ProfiledLoop", "_forward_end"), ("ProfiledLoop", "_optimizer_start"),
                ("ProfiledLoop", "_optimizer_end"))


class InPlace:
    """Timers around perfhooks' entry points and, inside them, around the simulation's calls (ns in all)."""

    def __init__(self) -> None:
        self.inside_ns = self.simulation_ns = 0
        self.depth = 0

    def reset(self) -> None:
        self.inside_ns = self.simulation_ns = 0

    def entry(self, function: Any) -> Any:
        clock = time.perf_counter_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                self.depth -= 1
                if not self.depth:
                    self.inside_ns += clock() - started

        return timed

    def simulated(self, function: Any) -> Any:
        clock = time.perf_counter_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.depth:
                return function(*args, **kwargs)
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                self.simulation_ns += clock() - started

        return timed


@contextlib.contextmanager
def metered(more_entries: Sequence[tuple[type, str]] = (), simulation: bool = True) -> Iterator[InPlace]:
    """An :class:`InPlace` meter around perfhooks' entry points (:data:`ENTRY_POINTS`, and ``more_entries``) and,
    with ``simulation``, the simulation's calls made inside them, for the length of the block; everything put back
    after. Without it (a real GPU) the device calls are timed as part of the entry points, at their real cost."""
    import perfhooks.runtime.loops.plain_loop as plain

    meter = InPlace()
    entries = [(getattr(plain, owner), name) for owner, name in ENTRY_POINTS] + list(more_entries)
    calls: list[tuple[Any, str]] = []
    if simulation:  # the simulated GPU lives with the tests
        tests = str(Path(__file__).resolve().parents[1] / "tests")
        if tests not in sys.path:  # metered once a round: the path gets the folder once
            sys.path.insert(0, tests)
        from simulated_gpu import SimEvent

        calls = [(SimEvent, "record"), (torch._C, "_cuda_getCurrentStream"),
                 (torch.cuda, "is_current_stream_capturing"), (torch._C, "_cuda_memoryStats"),
                 (torch.cuda, "mem_get_info")]
    with contextlib.ExitStack() as patches:
        for target, name in entries:
            patches.enter_context(mock.patch.object(target, name, meter.entry(getattr(target, name))))
        for target, name in calls:
            patches.enter_context(mock.patch.object(target, name, meter.simulated(getattr(target, name))))
        yield meter


@contextlib.contextmanager
def on_the_simulated_gpu(memory_bytes: int = 1 << 30) -> Iterator[Any]:
    """The simulated GPU (``tests/simulated_gpu.py``: each device call charged its host cost on an H100) for the
    length of the block, every engine perfhooks starts bound to its ``cuda:0`` (the model's tensors stay on the
    CPU), and torch's CPU ops on one thread, as a GPU host's training thread runs them; all put back after.

    One thread: with OpenMP's default two threads on this 2-core machine, the second spin-waits through every op
    and a benchmark's background threads compete with it (on the simulated launch-bound loop the floor's rounds
    spread over 31 to 117 µs, 10 rounds, against 38 to 50 µs on one thread, 8 rounds, at about the same median)."""
    from perfhooks.runtime.engine import Engine

    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from simulated_gpu import simulated_cuda

    threads = torch.get_num_threads()
    start = Engine.__dict__["start"]

    def on_device(cls: type, *args: Any, **kwargs: Any) -> Any:
        kwargs["device"] = "cuda:0"
        return start.__func__(cls, *args, **kwargs)

    torch.set_num_threads(1)
    Engine.start = classmethod(on_device)  # type: ignore[method-assign, assignment]
    try:
        with simulated_cuda(memory_bytes=memory_bytes) as gpu:
            yield gpu
    finally:
        Engine.start = start  # type: ignore[method-assign]
        torch.set_num_threads(threads)


def threads_cpu_s(prefix: str = "") -> dict[str, float]:
    """CPU seconds so far of each Python thread but the calling one whose name starts with ``prefix``, by name
    (perfhooks' threads are named ``perfhooks-*``); a thread that ended meanwhile is left out."""
    times: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.ident is None or not thread.name.startswith(prefix):
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):  # ended meanwhile, or no per-thread clocks here
            continue
        times[thread.name] = times.get(thread.name, 0.0) + seconds
    return times


# ----------------------------------------------------------------------------- comparing runs
def rotate_rounds(names: Sequence[str], measure: Callable[[str], Any], rounds: int, deadline: float = float("inf"),
                  clock: Callable[[], float] = time.monotonic,
                  after_round: Callable[[dict[str, list[Any]]], None] | None = None) -> dict[str, list[Any]]:
    """``measure(name)`` for every name, round after round, each round starting one name later (A/B/C, B/C/A,
    C/A/B; with two names, A/B then B/A), so that no variant always follows the same one; each name's results,
    round by round. A round that would end past ``deadline`` (s on ``clock``, judged by the mean round so far) is
    not begun; the first always runs. ``after_round`` gets the results so far after each round (to save them)."""
    names = list(names)
    results: dict[str, list[Any]] = {name: [] for name in names}
    started = clock()
    for round_ in range(rounds):
        now = clock()
        if round_ and now + (now - started) / round_ > deadline:
            break
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            results[name].append(measure(name))
        if after_round is not None:
            after_round(results)
    return results


def steady_step(ends: Sequence[float], skip_first: int, skip_last: int = 0) -> float:
    """A run's steady step: the median gap between consecutive step ends (batch end to batch end, in the ends'
    unit), the first ``skip_first`` steps (warm-up) and the last ``skip_last`` (a window's export) left out."""
    kept = ends[skip_first:len(ends) - skip_last]
    return statistics.median(b - a for a, b in itertools.pairwise(kept))


def paired(values: Sequence[float], base: Sequence[float]) -> list[float]:
    """Each round's ``value - base``: the rounds ran both back to back, so the machine's drift between rounds,
    which each variant's own median keeps, cancels."""
    return [value - other for value, other in zip(values, base, strict=True)]


def spread(values: Sequence[float], digits: int = 1) -> str:
    """``median (rounds min to max)``, the way every script says a figure over rounds."""
    return (f"{statistics.median(values):.{digits}f} (rounds {min(values):.{digits}f} to "
            f"{max(values):.{digits}f})")


def paired_added_us(times: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Each variant against ``bare`` in the same round (:func:`paired`, ms a step per round, of the wall clock or
    of the training thread's CPU): the median of the differences (µs a step) and the rounds it was slower in."""
    out: dict[str, dict[str, Any]] = {}
    for name, values in times.items():
        differences = [difference * 1e3 for difference in paired(values, times["bare"])]
        if name != "bare" and differences:
            out[name] = {"median_us": round(statistics.median(differences), 1),
                         "slower_rounds": f"{sum(d > 0 for d in differences)}/{len(differences)}"}
    return out
