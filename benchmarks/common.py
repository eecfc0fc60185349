"""What the benchmark scripts share, in one module (no script imports another): the machine a figure was
measured on, and the simulated GPU's helpers: the floor design, the in-place meter around perfhooks' entry points,
one torch thread, perfhooks bound to the simulation, and each perfhooks thread's CPU time."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator, Sequence
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


def one_torch_thread() -> None:
    """torch's CPU ops on one thread, as a GPU host's training thread runs them (its ops go to the device). With
    OpenMP's default two threads on this 2-core machine, the second spin-waits through every op and a benchmark's
    background threads compete with it: on the simulated launch-bound loop the floor's rounds spread over 31 to
    117 µs (10 rounds), against 38 to 50 µs on one thread (8 rounds), at about the same median (46 and 43)."""
    torch.set_num_threads(1)


def bind_to_the_simulation() -> None:
    """Every engine perfhooks starts is bound to ``cuda:0`` (the model's tensors are on the CPU)."""
    from perfhooks.runtime.engine import Engine

    start = Engine.start.__func__  # type: ignore[attr-defined]

    def on_device(cls: type, *args: Any, **kwargs: Any) -> Any:
        kwargs["device"] = "cuda:0"
        return start(cls, *args, **kwargs)

    Engine.start = classmethod(on_device)  # type: ignore[method-assign]


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each of perfhooks' threads so far (``/proc/self/task/<tid>/stat``: utime + stime)."""
    import os
    import threading

    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if not thread.name.startswith("perfhooks") or thread.native_id is None:
            continue
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[thread.name] = out.get(thread.name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out
