"""The overhead figures of a lent GPU, in one run (``benchmarks/gpu_check.sh`` calls it).

    python benchmarks/gpu_check.py --out DIR [--rounds 5] [--dry-run | --simulated]
    python benchmarks/gpu_check.py --isolate --out DIR [--rounds 5] [--budget-s 300] [--dry-run] [--loops ...]

1. **A launch-bound loop** (4 x Linear(1024), batch 64, fused Adam: a ~1-2 ms step of small kernels), bare and under
   ``perfhooks.profile`` without windows, then with each of its parts switched off in turn from there (NVTX, the
   memory monitor, the FLOP count, the device events, the reader's own timer: :data:`PARTS`), and two ways of
   reading the timings that may cost a host-bound step less (a reader whose reads hold the GIL, and no reader
   thread at all), the events recorded but never read, and the floor (no perfhooks: the least any design does at
   the loop's six boundaries, ``FLOOR``), alternating round after round. Each run gives its CPU
   time a step of the training thread, of the other threads and of each named one (perfhooks' are
   ``perfhooks-*``), and the garbage collector's time a step; each variant, its difference from bare in the same
   round, of the step (``paired_added_us``) and of the training thread's CPU (``paired_cpu_added_us``). Target,
   for the defaults (``--isolate``): at most +50 µs a step. Before the alternation, **in place**
   (:func:`in_place`): perfhooks' own time a step inside its entry points, its device calls at their real cost
   included, beside the floor's, with its share of the run's own step.
2. **A host-bound Lightning GPT** (12 layers, d 768, 12 heads, T 512, vocab 32768, batch 16: the 135M shape of the
   2026-11-27 measurements; ``bf16-mixed``), bare and with ``PerfCallback()``, the same variants (but the
   reading's three) and alternation, after perfhooks' own time a step in place (:func:`in_place_gpt`) and its share
   of the run's own step. Target: an alternating ratio of at most 1.01.
3. **Where the training thread's time goes**: ``cProfile`` over the launch-bound loop, bare and without windows
   (calls and own time a step by function: which calls grew, not how much a step costs unprofiled).
4. **Device API calls a step**: torch's profiler over 50 steps of the launch-bound loop, bare and with perfhooks
   (run last: a plain ``torch.profiler`` leaves CUPTI attached).

Each figure is the median steady step of the script's own clock (a synchronize at the ends of the measured
span). The variants share one process, which is fair only while none leaves CUPTI attached: no variant opens a
window (what a window leaves behind is ``--isolate``'s, a fresh process per run), the warm-up opens none,
and the API-call count runs last.

``--dry-run`` (no GPU, or asked for) runs every part on the CPU at a tiny size, one round, to show the script
works; its figures mean nothing. ``--simulated`` runs the launch-bound loop's variants on the simulated GPU,
with every device call charged (no GPU needed; :func:`simulated`). Rounds stop early, never below one, when
``--budget-s`` would be overrun, and what was measured is written. Writes ``DIR/gpu_check.json``, after each part.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import gc
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import describe_machine, on_the_simulated_gpu, paired_added_us, rotate_rounds, threads_cpu_s  # noqa: E402

#: perfhooks' parts, each switched off in turn from perfhooks without windows (the settings that do it). No
#: variant opens a window, so the variants can share one process whatever a window leaves behind (CUPTI);
#: ``--isolate`` measures the defaults, window included, each run in a fresh process.
#: The upper-case names are the benchmark's own switches, not settings (:func:`perfhooks_settings`):
#: ``HOST_CLOCK``, steps timed on the host (no device event at all); ``TORCH_TIMER``, the timing reader reads
#: intervals through torch's ``elapsed_time`` (which holds the GIL) rather than its own GIL-free timer;
#: ``READER_HOLDS_GIL``, its own timer called without releasing the GIL (``ctypes.PyDLL``: each of the training
#: thread's event records releases the GIL, and a reader that releases it too at every read may take it back in
#: the middle of the training thread's step, read after read); ``READS_INLINE``, no reader thread: the training
#: thread reads the finished steps at each step's end, through the same GIL-free timer (uncontended there);
#: ``READS_NONE``, the events recorded and never read (no reader, each step's marks returned at its end, no
#: timings): what the records cost alone, the reading being the difference from ``no_window``. ``FLOOR``, no
#: perfhooks: ``common.Floor``, the least any design does at the loop's six boundaries through the same
#: torch hooks (take the time, record a pooled event where CUDA is, append; one capture check a step): what
#: perfhooks' target can be measured against on the same card.
HOST_CLOCK = "host_clock"
TORCH_TIMER = "torch_timer"
READER_HOLDS_GIL = "reader_holds_gil"
READS_INLINE = "reads_inline"
READS_NONE = "reads_none"
SWITCHES = (HOST_CLOCK, TORCH_TIMER, READER_HOLDS_GIL, READS_INLINE, READS_NONE)
FLOOR = "floor"
PARTS: dict[str, dict[str, Any] | None] = {
    "bare": None,
    "no_window": {"schedule": None},
    "no_nvtx": {"schedule": None, "nvtx": False},
    "no_memory": {"schedule": None, "memory": False},
    "no_flop_count": {"schedule": None, "count_flops": False},
    "no_device_events": {"schedule": None, HOST_CLOCK: True},
    "torch_timer": {"schedule": None, TORCH_TIMER: True},
    "reader_holds_gil": {"schedule": None, READER_HOLDS_GIL: True},
    "reads_inline": {"schedule": None, READS_INLINE: True},
    "records_only": {"schedule": None, READS_NONE: True},
    "floor": {FLOOR: True},
}
#: The reader's three experiments run on the launch-bound loop only (where the reader's share of each second is
#: largest): the GPT's rounds are long, and its ratio needs as many of them as the budget allows.
LAUNCH_BOUND_ONLY = ("reader_holds_gil", "reads_inline", "records_only", "floor")

#: The measured span starts at this step at the earliest, after the default window (steps 8-12).
FIRST_TIMED_STEP = 20


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _HostClockOnly:
    """Stands in for perfhooks' ``DeviceClock`` while a ``HOST_CLOCK`` variant builds its engine: the run's steps
    are timed on the host (the timing reader still runs, with nothing to ask the device)."""

    def __new__(cls, room: Any) -> Any:
        from perfhooks.device.clock import HostClock

        return HostClock()


@contextlib.contextmanager
def perfhooks_settings(settings: dict[str, Any] | None) -> Iterator[dict[str, Any] | None]:
    """``settings`` without the benchmark's own switches (:data:`SWITCHES`), with perfhooks patched as they ask
    while the run lasts (the engine makes its clock and starts its reader when it starts; the reader makes its
    timer at its first read)."""
    if not settings or not any(settings.get(switch) for switch in SWITCHES):
        yield settings
        return
    import perfhooks.runtime.engine as engine
    from perfhooks.device.room import DeviceRoom
    from perfhooks.runtime.step.steps import PendingSteps
    from perfhooks.runtime.step.timing_reader import TimingReader

    with contextlib.ExitStack() as patches:
        if settings.get(HOST_CLOCK):
            patches.enter_context(mock.patch.object(engine, "DeviceClock", _HostClockOnly))
        if settings.get(TORCH_TIMER):
            patches.enter_context(mock.patch.object(DeviceRoom, "thread_timer", lambda room: None))
        if settings.get(READER_HOLDS_GIL):
            holding = DeviceRoom.thread_timer
            patches.enter_context(mock.patch.object(DeviceRoom, "thread_timer",
                                                    lambda room: holding(room, release_gil=False)))
        if settings.get(READS_INLINE):
            patches.enter_context(mock.patch.object(TimingReader, "start", _read_inline))
        if settings.get(READS_NONE):
            patches.enter_context(mock.patch.object(TimingReader, "start", lambda reader: None))
            patches.enter_context(mock.patch.object(PendingSteps, "add", _discard_step))
        yield {key: value for key, value in settings.items() if key not in SWITCHES}


def _read_inline(reader: Any) -> None:
    """Stands in for ``TimingReader.start`` in ``READS_INLINE``: no thread; the training thread (the one that
    starts the engine) binds the clock's timer and reads the finished steps at each step's end."""
    reader.pending.clock.bind_reader()


def _discard_step(pending: Any, record: Any, stats: Any) -> None:
    """Stands in for ``PendingSteps.add`` in ``READS_NONE``: the step's events go back to the pool unread."""
    pending.discard(record)


# ----------------------------------------------------------------------------- 1. the launch-bound loop
def launch_bound_job(device: str, dry: bool) -> tuple[torch.nn.Module, Any, list[torch.Tensor]]:
    width = 64 if dry else 1024
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=device == "cuda")
    batches = [torch.randn(64, width, device=device) for _ in range(4)]
    return model, optimizer, batches


class RawWindow:
    """A bare ``torch.profiler`` window over the default window's recorded steps (10-12), without perfhooks: what
    any profiler window leaves behind for the steps after it (CUPTI attached)."""

    START, STOP = 10, 13

    def __init__(self, device: str) -> None:
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler: Any = None

    def at_step(self, step: int) -> None:
        """Before step ``step`` runs."""
        if step == self.START:
            self.profiler = torch.profiler.profile(activities=self.activities)
            self.profiler.start()
        elif step == self.STOP and self.profiler is not None:
            self.profiler.stop()
            self.profiler = None


class GarbageCollections:
    """The garbage collector's passes and their time (s), counted through ``gc.callbacks`` (installed at the first
    span, for the rest of the benchmark; importing this module installs nothing): the bare loop allocates almost
    nothing that outlives a step, so each pass in a span is one a profiler's allocations asked for."""

    _installed: GarbageCollections | None = None

    @classmethod
    def installed(cls) -> GarbageCollections:
        if cls._installed is None:
            cls._installed = cls()
        return cls._installed

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.passes[info["generation"]] += 1

    def now(self) -> tuple[float, tuple[int, ...]]:
        return self.seconds, tuple(self.passes)


class Span:
    """The timed span's clocks: wall, the training thread's CPU, the whole process's CPU, each other Python
    thread's CPU (s), and the garbage collector's passes."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float, float, float, dict[str, float], tuple[float, tuple[int, ...]]]] = []

    def mark(self, device: str, step: int) -> None:
        """At step ``step`` (after a synchronize): the span is timed from its first mark to its last."""
        _sync(device)
        self.marks.append((step, time.perf_counter(), time.thread_time(), time.process_time(),
                           threads_cpu_s(), GarbageCollections.installed().now()))

    def per_step(self) -> dict[str, Any]:
        """Per timed step (ms): the wall clock, the training thread's CPU, the CPU of every other thread, and of
        each named Python thread among them (threads of C++ alone, autograd's device threads among them, are in
        ``other_cpu_ms`` only; a thread alive through the span is named even if it did not run, as the timing reader
        may not in a span shorter than its period); the garbage collector's time (ms a step) and passes by
        generation (in the span)."""
        (step0, wall0, main0, all0, threads0, gc0), (step1, wall1, main1, all1, threads1, gc1) = (self.marks[0],
                                                                                                  self.marks[-1])
        steps = step1 - step0
        threads = {name: round((cpu - threads0.get(name, 0.0)) / steps * 1e3, 4) for name, cpu in threads1.items()}
        return {"step_ms": (wall1 - wall0) / steps * 1e3, "main_cpu_ms": (main1 - main0) / steps * 1e3,
                "other_cpu_ms": max(0.0, (all1 - all0) - (main1 - main0)) / steps * 1e3,  # clocks' grain
                "threads_cpu_ms": {name: ms for name, ms in sorted(threads.items()) if ms > 0 or name in threads0},
                "gc_ms": round((gc1[0] - gc0[0]) / steps * 1e3, 4),
                "gc_passes": [after - before for before, after in zip(gc0[1], gc1[1], strict=True)]}


def launch_bound_ms(job: Any, settings: dict[str, Any] | None, steps: int, device: str, out: str,
                    raw_window: bool = False, span: Span | None = None) -> dict[str, Any]:
    """The loop's timed span, per step (:meth:`Span.per_step`: the mean step and the threads' CPU, ms);
    ``raw_window``: a bare profiler window (no perfhooks)."""
    if settings is not None and settings.get(FLOOR):
        return _launch_bound(job, None, steps, device, out, raw_window, span or Span(), floor=True)
    with perfhooks_settings(settings) as settings:
        return _launch_bound(job, settings, steps, device, out, raw_window, span or Span())


def _launch_bound(job: Any, settings: dict[str, Any] | None, steps: int, device: str, out: str, raw_window: bool,
                  span: Span, floor: bool = False) -> dict[str, Any]:
    from common import Floor

    import perfhooks

    model, optimizer, batches = job
    first = max(steps // 5, FIRST_TIMED_STEP) if steps > 2 * FIRST_TIMED_STEP else steps // 5  # short: API calls
    perf = perfhooks.profile(model, optimizer, output_dir=out, console=False, **settings) \
        if settings is not None else None
    fetch: Any = perf.data_wait if perf is not None else contextlib.nullcontext
    marks = Floor(model, optimizer, device=torch.cuda.is_available()) if floor else None  # the simulation's too
    if marks is not None:
        def fetch() -> Any:
            return marks
    window = RawWindow(device) if raw_window else None
    for i in range(steps):
        if window is not None:
            window.at_step(i)
        with fetch():
            x = batches[i % len(batches)]
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i in (first, steps - 1):
            span.mark(device, i)
    result = span.per_step()
    if perf is not None:
        perf.close()
        result["overhead"] = _overhead(perf.engine)  # the budget's own account: kept, share_of_run, in place
    if marks is not None:
        marks.remove()
    return result


def _overhead(engine: Any) -> dict[str, Any] | None:
    """The ``overhead`` section of a closed engine's report (issue 65: ``kept``, ``share_of_run``, ...)."""
    return (getattr(engine, "final_report", None) or {}).get("overhead")


class MeteredSpan(Span):
    """A :class:`Span` that also reads an in-place meter (``common.InPlace``) at its marks."""

    def __init__(self, meter: Any) -> None:
        super().__init__()
        self.meter = meter
        self.inside_ns: list[int] = []

    def mark(self, device: str, step: int) -> None:
        super().mark(device, step)
        self.inside_ns.append(self.meter.inside_ns)

    def inside_us(self) -> float:
        """µs a timed step inside the metered entry points."""
        return (self.inside_ns[-1] - self.inside_ns[0]) / (self.marks[-1][0] - self.marks[0][0]) / 1e3


def metered_rounds(entries: list[tuple[type, str]], runs: dict[str, Callable[[Span], Any]], rounds: int,
                   deadline: float) -> dict[str, Any]:
    """Each run's time a timed step inside ``entries`` (µs, ``common.metered`` without the simulation: the
    device calls at their real cost), ``runs[name](span)`` in :func:`rotate_rounds` (``deadline`` on
    ``time.monotonic()``), with each run's step (µs) and that time's share of it."""
    from common import metered

    with metered(entries, simulation=False) as meter:
        def inside_us(name: str) -> tuple[float, float]:
            span = MeteredSpan(meter)
            step_ms = runs[name](span)["step_ms"]
            return round(span.inside_us(), 2), round(step_ms * 1e3, 1)

        figures = rotate_rounds(list(runs), inside_us, rounds, deadline)
    return {"rounds": len(figures[next(iter(runs))]),
            "us_per_step": {name: [inside for inside, _ in values] for name, values in figures.items()},
            "median_us": {name: round(statistics.median(inside for inside, _ in values), 2)
                          for name, values in figures.items()},
            "share_of_step": {name: round(statistics.median(inside / step for inside, step in values), 5)
                              for name, values in figures.items()}}


def in_place(job: Any, device: str, out: str, steps: int, rounds: int, deadline: float) -> dict[str, Any]:
    """perfhooks' own time a steady step of the launch-bound loop on the training thread, in place (µs): the time
    inside its entry points (``common.ENTRY_POINTS``), its device calls at their real cost included, and the
    same meters around the floor's (``FLOOR``), alternating. Torch's own cost of calling a hook and what perfhooks
    does to the caches are not in it (the wall clock has them); its noise is a few µs where the wall clock's is
    hundreds on a GPU's host."""
    from common import Floor

    return metered_rounds(
        [(Floor, "mark"), (Floor, "__enter__"), (Floor, "__exit__")],
        {name: lambda span, name=name: launch_bound_ms(job, PARTS[name], steps, device, out, span=span)
         for name in ("no_window", "floor")}, rounds, deadline)


#: What the Lightning integration runs on the training thread a step (``PerfCallback``'s hooks, its fetch and its
#: optimizer hook) and the engine's fetch, which Lightning's fetcher reaches through a wrapper of its own.
LIGHTNING_ENTRIES = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
                     "_after_optimizer_step", "on_train_batch_end", "_step_opened")


def in_place_gpt(steps: int, device: str, dry: bool, out: str, rounds: int, deadline: float) -> dict[str, Any]:
    """perfhooks' own time a steady step of the Lightning GPT on the training thread, in place (µs; as
    :func:`in_place`, perfhooks without windows): inside ``PerfCallback``'s step hooks (:data:`LIGHTNING_ENTRIES`) and
    the tracker's fetch. The callback timing's profiler wrappers (a step in 16) are not in it. Its share of the step
    bounds the ratio that the alternation cannot resolve on a GPU (±5 ms a run on a 35 ms step)."""
    from perfhooks.integrations.lightning import PerfCallback
    from perfhooks.runtime.step.tracker import StepTracker

    return metered_rounds(
        [(PerfCallback, name) for name in LIGHTNING_ENTRIES] + [(StepTracker, "fetch")],
        {"no_window": lambda span: lightning_gpt_ms(PARTS["no_window"], steps, device, dry, out, span=span)},
        rounds, deadline)


# ----------------------------------------------------------------------------- 2. the Lightning GPT
def lightning_gpt_ms(settings: dict[str, Any] | None, steps: int, device: str, dry: bool, out: str,
                     raw_window: bool = False, span: Span | None = None) -> dict[str, Any]:
    """The fit's span from ``FIRST_TIMED_STEP`` to its last step, by a synchronized clock, per step
    (:meth:`Span.per_step`); ``raw_window``: a bare profiler window (no perfhooks)."""
    with perfhooks_settings(settings) as settings:
        return _lightning_gpt(settings, steps, device, dry, out, raw_window, span or Span())


def _lightning_gpt(settings: dict[str, Any] | None, steps: int, device: str, dry: bool, out: str, raw_window: bool,
                   span: Span) -> dict[str, Any]:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from perfhooks.integrations.lightning import PerfCallback

    layers, width, heads, seq, vocab, batch = (2, 64, 4, 32, 256, 4) if dry else (12, 768, 12, 512, 32768, 16)

    class GPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.position = torch.nn.Parameter(torch.zeros(seq, width))
            block = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                     norm_first=True, activation="gelu")
            self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(width, vocab, bias=False)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            tokens, targets = batch
            hidden = self.blocks(self.embed(tokens) + self.position, mask=self.mask, is_causal=True)
            return torch.nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), targets.flatten())

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=3e-4, fused=device == "cuda")

    window = RawWindow(device) if raw_window else None

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if window is not None:
                window.at_step(trainer.global_step)
            if trainer.global_step in (FIRST_TIMED_STEP, steps - 1):
                span.mark(device, trainer.global_step)

    tokens = torch.randint(0, vocab, (steps * batch, seq + 1))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=batch)
    callbacks: list[Any] = [Clock()]
    perf = PerfCallback(output_dir=out, console=False, **settings) if settings is not None else None
    if perf is not None:
        callbacks.append(perf)
    trainer = L.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_steps=steps,
                        precision="bf16-mixed" if device == "cuda" else "32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=out, callbacks=callbacks)
    trainer.fit(GPT(), data)
    result = span.per_step()
    if perf is not None:
        result["overhead"] = _overhead(perf.engine)
    return result


# ----------------------------------------------------------------------------- alternation and API calls
def alternate(measure: Any, rounds: int, deadline: float, clock: Any = time.monotonic,
              after_round: Any = None, names: list[str] | None = None) -> dict[str, Any]:
    """Each part's step (:func:`rotate_rounds` over ``names``, default all :data:`PARTS`; ``measure(settings)``
    gives the step in ms, or :meth:`Span.per_step`); ratios to bare. ``after_round`` gets the summary so far."""
    results = rotate_rounds(names or list(PARTS), lambda name: measure(PARTS[name]), rounds, deadline, clock,
                            None if after_round is None else lambda so_far: after_round(_summary(so_far)))
    return _summary(results)


def _summary(results: dict[str, list[Any]]) -> dict[str, Any]:
    """Rounds, every step time (ms), the medians, each median against bare's (µs added, ratio), and, where the
    runs said, the medians of the threads' CPU a step (ms)."""
    times = {name: [run["step_ms"] if isinstance(run, dict) else run for run in runs]
             for name, runs in results.items()}
    median = {name: statistics.median(values) for name, values in times.items() if values}
    summary: dict[str, Any] = {
        "rounds": len(times["bare"]), "step_ms": times, "median_ms": median,
        "added_us_per_step": {name: round((ms - median["bare"]) * 1e3, 1) for name, ms in median.items()},
        "ratio": {name: round(ms / median["bare"], 4) for name, ms in median.items()},
        "paired_added_us": paired_added_us(times)}
    cpu = {name: cpu_medians(runs) for name, runs in results.items()
           if runs and all(isinstance(run, dict) for run in runs)}
    if cpu:
        summary["cpu_ms"] = cpu
    if "bare" in cpu and len(cpu) == len(results):  # the training thread's CPU a step, paired the same way
        summary["paired_cpu_added_us"] = paired_added_us(
            {name: [run["main_cpu_ms"] for run in runs] for name, runs in results.items()})
    overhead = {name: [{key: run["overhead"].get(key) for key in ("kept", "share_of_run", "captures_share",
                                                                  "in_place_us", "detailed_share", "paired")}
                       for run in runs if isinstance(run, dict) and run.get("overhead")]
                for name, runs in results.items()}
    if any(overhead.values()):  # each run's own account of its cost (the report's overhead section)
        summary["overhead"] = {name: runs for name, runs in overhead.items() if runs}
    return summary


def cpu_medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over ``runs`` of the training thread's CPU, the other threads', and each named thread's (ms a
    step)."""
    names = sorted({name for run in runs for name in run.get("threads_cpu_ms", {})})
    return {"main": round(statistics.median(run["main_cpu_ms"] for run in runs), 4),
            "other": round(statistics.median(run["other_cpu_ms"] for run in runs), 4),
            "gc": round(statistics.median(run.get("gc_ms", 0.0) for run in runs), 4),
            "threads": {name: round(statistics.median(run.get("threads_cpu_ms", {}).get(name, 0.0) for run in runs),
                                    4) for name in names}}


def where_time_goes(job: Any, device: str, out: str, steps: int = 400, top: int = 30) -> dict[str, Any]:
    """The training thread's time by function (``cProfile``), bare and under perfhooks without windows: each
    function's own time and calls a step (µs), the top ``top`` by own time. A deterministic profiler inflates
    Python frames, so the figures place the cost (which calls, how many, which C calls grew), not size it."""
    found: dict[str, Any] = {}
    for name in ("bare", "no_window"):
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            launch_bound_ms(job, PARTS[name], steps, device, out)
        finally:
            profiler.disable()
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        rows = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
        found[name] = [{"function": f"{Path(file).name}:{line}({function})", "calls": round(calls / steps, 2),
                        "own_us": round(own / steps * 1e6, 2), "total_us": round(total / steps * 1e6, 2)}
                       for (file, line, function), (_, calls, own, total, _) in rows]
    return found


def api_calls_per_step(job: Any, device: str, out: str, steps: int = 50) -> dict[str, dict[str, float]]:
    """The device runtime's calls a step (torch's profiler), bare and with perfhooks' defaults (no window)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    calls = {}
    for name, settings in (("bare", None), ("perfhooks", {"schedule": None})):
        with torch.profiler.profile(activities=activities) as profiler:
            launch_bound_ms(job, settings, steps, device, out)
        counts = collections.Counter(event.name for event in profiler.events()
                                     if event.name.startswith(("cuda", "cu")) and "LaunchKernel" not in event.name)
        calls[name] = {key: round(count / steps, 2) for key, count in counts.most_common(25)}
    return calls


class ResultFile:
    """A run's results, written whole to ``path`` after each part and each round: a run stopped by a timeout keeps
    what it measured, with the seconds it had run."""

    def __init__(self, path: Path, result: dict[str, Any]) -> None:
        self.path, self.result, self.started = path, result, time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        self.result["seconds"] = round(time.monotonic() - self.started, 1)
        self.path.write_text(json.dumps(self.result, indent=1))

    def keep(self, part: str, so_far: dict[str, Any]) -> None:
        self.result[part] = so_far
        self.save()


def simulated(out_dir: str, rounds: int, budget_s: float, steps: int = 1500) -> dict[str, Any]:
    """The launch-bound loop's variants (:data:`PARTS`) on the simulated GPU: the model on this CPU (the dry run's
    size, a host-bound step of a few hundred µs), perfhooks bound to ``cuda:0`` of the simulation, which charges
    each device call its host cost on an H100. The same figures as on a GPU, so that a part's cost can be placed
    here first and checked on the next lent GPU. Writes ``DIR/gpu_check_simulated.json``."""
    file = ResultFile(Path(out_dir) / "gpu_check_simulated.json",
                      {"machine": describe_machine(), "device": "simulated cuda:0 (model on the CPU)",
                       "torch": torch.__version__, "steps_per_run": steps})
    result = file.result
    with on_the_simulated_gpu(), tempfile.TemporaryDirectory() as out:
        job = launch_bound_job("cpu", dry=True)
        launch_bound_ms(job, None, 20, "cpu", out)  # warm-up
        file.keep("launch_bound", alternate(lambda s: launch_bound_ms(job, s, steps, "cpu", out), max(1, rounds),
                                            file.started + budget_s,
                                            after_round=lambda so_far: file.keep("launch_bound", so_far)))
        result["in_place"] = in_place(job, "cpu", out, steps, max(1, rounds), file.started + budget_s)
        file.save()
    for name, paired in result["launch_bound"]["paired_added_us"].items():
        cpu, paired_cpu = result["launch_bound"]["cpu_ms"][name], result["launch_bound"]["paired_cpu_added_us"][name]
        print(f"{name:18s} +{paired['median_us']:7.1f} µs a step (slower in {paired['slower_rounds']} rounds); "
              f"training thread cpu {cpu['main']:.4f} ms (+{paired_cpu['median_us']:.1f} µs paired, more in "
              f"{paired_cpu['slower_rounds']}), gc {cpu['gc']:.4f} ms, threads {cpu['threads']}")
    print(f"in place, µs a step, the device calls' charges and the simulation's Python included: "
          f"{result['in_place']['median_us']}")
    print(f"bare: {result['launch_bound']['median_ms']['bare'] * 1e3:.1f} µs a step; {file.path}, "
          f"{result['seconds']} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU, one round")
    parser.add_argument("--budget-s", type=float, default=280.0,
                        help="seconds for the whole script; rounds stop early to keep within it (default 280)")
    parser.add_argument("--loops", nargs="+", default=["launch_bound", "lightning_gpt"],
                        choices=["launch_bound", "lightning_gpt"], help="the loops to alternate (default both)")
    parser.add_argument("--simulated", action="store_true",
                        help="no GPU needed: the launch-bound loop's variants on this CPU, perfhooks bound to the "
                             "simulated GPU (tests/simulated_gpu.py, each device call charged)")
    parser.add_argument("--steps", type=int, default=1500, help="steps a run with --simulated (default 1500)")
    args = parser.parse_args()
    if args.simulated:
        simulated(args.out, args.rounds, args.budget_s, args.steps)
        return
    dry = args.dry_run or not torch.cuda.is_available()
    device = "cpu" if dry else "cuda"
    rounds = 1 if dry else max(5, args.rounds)  # the deadline, not the count, ends most real runs
    result: dict[str, Any] = {"machine": describe_machine(), "device": device, "dry_run": dry,
                              "card": torch.cuda.get_device_name(0) if not dry else None, "torch": torch.__version__}
    if dry:
        result["why_dry"] = "no CUDA device" if not torch.cuda.is_available() else "--dry-run"
    file = ResultFile(Path(args.out) / "gpu_check.json", result)
    started, save, keep = file.started, file.save, file.keep

    with tempfile.TemporaryDirectory() as out:
        job = launch_bound_job(device, dry)
        steps = 60 if dry else 400
        gpt_steps = FIRST_TIMED_STEP + (4 if dry else 40)
        launch_bound_ms(job, None, 20, device, out)  # warm-up: bare, no window
        deadline = started + args.budget_s - 25  # where the time goes and the API calls' count, after
        both = "launch_bound" in args.loops and "lightning_gpt" in args.loops

        def by(share: float) -> float:
            return min(deadline, started + share * args.budget_s)

        # first perfhooks' own time in place (a few µs of noise): what the alternation cannot resolve on a GPU
        if "launch_bound" in args.loops:
            result["in_place"] = in_place(job, device, out, steps, rounds, by(0.15 if both else 0.3))
            save()
        if "lightning_gpt" in args.loops:
            result["in_place_gpt"] = in_place_gpt(gpt_steps, device, dry, out, 1 if dry else 3,
                                                  by(0.35 if both else 0.4))
            save()
        if "launch_bound" in args.loops:
            result["launch_bound"] = alternate(lambda s: launch_bound_ms(job, s, steps, device, out), rounds,
                                               by(0.65 if both else 1.0),
                                               after_round=lambda so_far: keep("launch_bound", so_far))
            result["launch_bound"]["target"] = "at most +50 us a step (defaults)"
            save()
        if "lightning_gpt" in args.loops:
            result["lightning_gpt"] = alternate(lambda s: lightning_gpt_ms(s, gpt_steps, device, dry, out), rounds,
                                                deadline, after_round=lambda so_far: keep("lightning_gpt", so_far),
                                                names=[name for name in PARTS if name not in LAUNCH_BOUND_ONLY])
            result["lightning_gpt"]["target"] = "alternating ratio at most 1.01 (defaults)"
            save()
        result["where_time_goes"] = where_time_goes(job, device, out, 40 if dry else 400)
        save()
        result["api_calls_per_step"] = api_calls_per_step(job, device, out, 10 if dry else 50)  # last: CUPTI
    save()
    for part in args.loops:
        print(f"{part}: added µs a step {result[part]['added_us_per_step']}; ratio {result[part]['ratio']}")
        for name, cpu in result[part].get("cpu_ms", {}).items():
            print(f"  cpu ms a step, {name:18s} main {cpu['main']:.3f} other {cpu['other']:.3f} {cpu['threads']}")
    if "in_place" in result:
        print(f"in place, µs a launch-bound step ({result['in_place']['rounds']} rounds): "
              f"{result['in_place']['median_us']}")
    if "in_place_gpt" in result:
        gpt = result["in_place_gpt"]
        print(f"in place, µs a GPT step ({gpt['rounds']} rounds): {gpt['median_us']['no_window']}, "
              f"{gpt['share_of_step']['no_window']:.2%} of its step")
    print(f"api calls a step: {result['api_calls_per_step']}")
    print(f"{'DRY RUN (' + result['why_dry'] + '): figures mean nothing; ' if dry else ''}"
          f"{args.out}/gpu_check.json, {result['seconds']} s")


# ----------------------------------------------------------------------------- each run in a fresh process
# ``--isolate``:
# A ``torch.profiler`` window with CUDA activity attaches CUPTI to the process, and Kineto leaves it attached after
# the window unless ``TEARDOWN_CUPTI=1`` (perfhooks sets it for its windows: ``detach_cupti``). An attached CUPTI
# slows every later kernel launch of the process, so variants that share one process (the default mode) are
# comparable only while no window leaves it attached. Here each run is a child process of its own, and each figure
# is what a user's run of that kind pays:
#
# - ``bare``; ``bare_window`` (with ``--window-alone`` only): the same loop with a plain ``torch.profiler`` window
#   over steps 10-12, no perfhooks (what any profiler window leaves behind);
# - ``no_window``: perfhooks without windows (its own per-step cost);
# - ``floor`` (the launch-bound loop): no perfhooks, the least any design does at the six step boundaries
#   (``common.Floor``: take the time, record a pooled event, append; one capture check a step), so that
#   ``no_window`` less ``floor`` is what perfhooks costs beyond it, and ``floor`` says whether +50 µs is reachable
#   on that card at all;
# - ``defaults``: perfhooks as it comes (its window lets CUPTI go); ``defaults_attached`` (with ``--attached``
#   only): the same with ``detach_cupti=False`` (CUPTI left attached after the window, as before 2026-11-27; an H100
#   and an H200 showed it, +480 µs a launch-bound step on the H200).
#
# On the H200 (2026-11-28) one round in fresh processes read perfhooks without windows at +24 µs a launch-bound
# step, where 18 alternating rounds in one process read +252: the fresh-process rounds come first now, and the
# budget gives them the most.
#
# Each child reports, per timed step (after the default window: steps 80-399 of 400, or 20-59 of 60 for the GPT),
# the wall clock, the training thread's CPU time, the CPU time of every other thread and of each named Python
# thread among them (perfhooks' are ``perfhooks-*``) (ms); the launch-bound
# loop runs 3 times in its child (a later run of a window variant starts with CUPTI as the first left it), and the
# child reports their medians. Rounds rotate the
# variants' order and stop early, never below one, when ``--budget-s`` would be overrun; the JSON is saved after
# each round. ``--dry-run`` (no GPU, or asked for) runs tiny on the CPU to show the script works.
# Every figure measured so far is in benchmarks/results/ (gpu_isolate.json in each GPU's folder).

#: Each variant: perfhooks' settings (None: not used) and whether a plain profiler window runs (no perfhooks).
IsolateVariant = tuple[dict[str, Any] | None, bool]
ISOLATE_VARIANTS: dict[str, dict[str, IsolateVariant]] = {
    "launch_bound": {"bare": (None, False), "no_window": ({"schedule": None}, False),
                     "floor": ({"floor": True}, False), "defaults": ({}, False)},  # FLOOR
    #: a child process here takes about 24 s on an H100 machine
    "lightning_gpt": {"bare": (None, False), "no_window": ({"schedule": None}, False), "defaults": ({}, False)},
}
#: Not run by default (known since 2026-11-27: any window leaves CUPTI attached): ``--window-alone``.
ISOLATE_BARE_WINDOW: IsolateVariant = (None, True)
#: Not run by default (known since 2026-11-27, and ``detach_cupti`` is on by default): ``--attached``.
ISOLATE_ATTACHED: IsolateVariant = ({"detach_cupti": False}, False)


#: Runs of the launch-bound loop in each child process (one starts in about 12 s on an H100 machine; a run: 1 s).
ISOLATE_LAUNCH_BOUND_RUNS = 3


def isolate_child(loop: str, name: str, dry: bool) -> dict[str, Any]:
    """Run ``loop`` under variant ``name`` in this process; its per-step figures (the median of its runs)."""
    import torch

    extra = {"bare_window": ISOLATE_BARE_WINDOW, "defaults_attached": ISOLATE_ATTACHED}
    settings, raw_window = extra[name] if name in extra else ISOLATE_VARIANTS[loop][name]
    device = "cpu" if dry or not torch.cuda.is_available() else "cuda"
    spans: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as out:
        if loop == "launch_bound":
            job = launch_bound_job(device, dry)
            launch_bound_ms(job, None, 20, device, out)  # warm-up, bare: no window, no CUPTI
            for _ in range(ISOLATE_LAUNCH_BOUND_RUNS):
                span = Span()
                launch_bound_ms(job, settings, 60 if dry else 400, device, out, raw_window, span)
                spans.append(span.per_step())
        else:
            span = Span()
            lightning_gpt_ms(settings, FIRST_TIMED_STEP + (4 if dry else 40), device, dry, out,
                                       raw_window, span)
            spans.append(span.per_step())
    figures: dict[str, Any] = isolate_medians(spans)
    names = {name for run in spans for name in run["threads_cpu_ms"]}
    figures["threads_cpu_ms"] = {name: round(statistics.median(run["threads_cpu_ms"].get(name, 0.0) for run in spans),
                                             4) for name in sorted(names)}
    return figures


def isolate_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median over ``runs`` of the step time and the two CPU times (ms)."""
    return {key: round(statistics.median(run[key] for run in runs), 4)
            for key in ("step_ms", "main_cpu_ms", "other_cpu_ms")}


def isolate_run_child(loop: str, name: str, dry: bool) -> dict[str, Any]:
    """``isolate_child`` in a fresh interpreter."""
    command = [sys.executable, __file__, "--isolate-child", loop, name] + (["--dry-run"] if dry else [])
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"}
    return {**json.loads(lines[-1]), "process_s": round(time.monotonic() - started, 1)}


def isolate_summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians of each variant's runs, and each median's step time against bare's (µs added)."""
    median: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        good = [result for result in results if "error" not in result]
        if good:
            median[name] = isolate_medians(good)
    bare = median.get("bare", {}).get("step_ms")
    added = {name: round((m["step_ms"] - bare) * 1e3, 1) for name, m in median.items()} if bare else {}
    return {"rounds": len(runs.get("bare", [])), "runs": runs, "median": median, "added_us_per_step": added}


def isolate_alternate(loop: str, rounds: int, deadline: float, dry: bool, save: Any, window_alone: bool = False,
              attached: bool = False) -> dict[str, Any]:
    """Every variant of ``loop``, each in a child process of its own, round after round (``rotate_rounds``)."""
    names = list(ISOLATE_VARIANTS[loop]) + (["bare_window"] if window_alone else []) + (
        ["defaults_attached"] if attached else [])
    runs = rotate_rounds(names, lambda name: isolate_run_child(loop, name, dry), rounds, deadline,
                                   after_round=lambda so_far: save(loop, isolate_summary(so_far)))
    return isolate_summary(runs)


def isolate_main() -> None:
    parser = argparse.ArgumentParser(description="perfhooks' cost on a GPU with each run in a fresh process")
    parser.add_argument("--out", help="folder for gpu_isolate.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=300.0, help="seconds for the whole script (default 300)")
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU, one round")
    parser.add_argument("--loops", nargs="+", default=list(ISOLATE_VARIANTS), choices=list(ISOLATE_VARIANTS))
    parser.add_argument("--window-alone", action="store_true",
                        help="also a plain torch.profiler window without perfhooks (bare_window)")
    parser.add_argument("--attached", action="store_true",
                        help="also perfhooks' defaults with CUPTI left attached after the window (defaults_attached)")
    parser.add_argument("--isolate", action="store_true", help="each run in a fresh process (this mode)")
    parser.add_argument("--isolate-child", nargs=2, metavar=("LOOP", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.isolate_child:
        print(json.dumps(isolate_child(*args.isolate_child, args.dry_run)))
        return
    if not args.out:
        parser.error("--out is required: the folder for gpu_isolate.json")
    import torch
    from common import describe_machine

    dry = args.dry_run or not torch.cuda.is_available()
    result: dict[str, Any] = {"machine": describe_machine(), "dry_run": dry, "torch": torch.__version__,
                              "card": None if dry else torch.cuda.get_device_name(0)}
    saved = Path(args.out) / "gpu_isolate.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def save(loop: str, so_far: dict[str, Any]) -> None:
        result[loop] = so_far
        result["seconds"] = round(time.monotonic() - started, 1)
        saved.write_text(json.dumps(result, indent=1))

    shares = {"launch_bound": 0.5, "lightning_gpt": 1.0}  # two rounds of four on an H200 machine, then the GPT
    for loop in args.loops:
        deadline = started + shares[loop] * args.budget_s if len(args.loops) > 1 else started + args.budget_s
        save(loop, isolate_alternate(loop, 1 if dry else args.rounds, deadline, dry, save, args.window_alone,
                             args.attached))
        print(f"{loop}: µs added a step {result[loop]['added_us_per_step']}")
        for name, median in result[loop]["median"].items():
            print(f"  {name:22s} {median}")
    print(f"{'DRY RUN: figures mean nothing; ' if dry else ''}{saved}, {result['seconds']} s")


if __name__ == "__main__":
    if "--isolate" in sys.argv or "--isolate-child" in sys.argv:
        isolate_main()
    else:
        main()
