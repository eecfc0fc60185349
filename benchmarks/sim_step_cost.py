"""perfhooks' host time per step on the simulated GPU, with every device call charged its real cost.

    python benchmarks/sim_step_cost.py [--steps 400] [--rounds 7] [--free] [--loops engine plain_loop]
    python benchmarks/sim_step_cost.py --bookkeeping [--rounds 5]
    python benchmarks/sim_step_cost.py --budget --rounds 12
    python benchmarks/sim_step_cost.py --reader [--rounds 15]
    python benchmarks/sim_step_cost.py --lightning-parts [--steps 2000] [--rounds 5]

A CPU benchmark of a GPU run's cost: the simulated GPU (``tests/simulated_gpu.py``) spins the calling thread for
each device call as long as the call costs on an H100 (an event record 2.5 µs, a query 1 µs, a Python ``Stream``
4.4 µs, a flattened ``memory_stats()`` 30 µs; ``--free`` makes them cost nothing), so the calls perfhooks makes
show up in the step time as they do on a host-bound GPU step. perfhooks is bound to ``cuda:0`` of the
simulation; the model's tensors stay on the CPU.

Two loops, each bare and with perfhooks (defaults, no profiler window: ``schedule=None``), alternating round
after round: ``engine``, the engine's events alone around two simulated kernels (what an integration sends a
step), and ``plain_loop``, ``perfhooks.profile`` on a two-layer model with AdamW (torch's hooks included). Each
round's figure is the median step (wall clock, batch to batch); the result is the median over rounds of
(perfhooks - bare) in µs a step, with the rounds' range, and the device calls a step by thread. The simulation's
calls are Python (about 1 µs each, warm) on top of the cost they charge; the part of the figure that is the test
bed's own Python (its calls a step × their overhead, calibrated in a warm loop, so a floor) is said and taken out
of the net figure the target is checked against.
Target (issue 49): at most 25 µs a step for the plain loop on the 2-core machine, idle.

``--bookkeeping``: the plain loop in place only, whole and with each piece of a step's bookkeeping knocked out in
turn (the statistics, the published state, the step's open): what each costs, and what is left for the six
boundaries themselves.

``--reader``: the timing reader's Python a step, its device calls free (:func:`reader_cost`).

``--lightning-parts``: a host-bound Lightning fit with its defaults on, each part of perfhooks off in turn
(:func:`lightning_parts`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import (  # noqa: E402
    Floor,
    describe_machine,
    metered,
    on_the_simulated_gpu,
    paired,
    rotate_rounds,
    spread,
    steady_step,
    threads_cpu_s,
)
from simulated_gpu import DEVICE_CALLS, SimulatedGpu  # noqa: E402

TARGET_US = 25.0
SETTINGS: dict[str, Any] = {"console": False, "schedule": None, "on_demand": False}


def _median_step_us(ends: list[int]) -> float:
    """The run's steady step in µs (``ends`` in ns), past its first five steps."""
    return steady_step(ends, skip_first=5) / 1e3


def engine_loop(gpu: SimulatedGpu, steps: int, profiled: bool, out: str) -> tuple[float, collections.Counter]:
    from perfhooks import Engine, PerfConfig

    engine = Engine(PerfConfig(**SETTINGS), out, "bench", device="cuda:0") if profiled else None
    ends: list[int] = []
    before = collections.Counter(gpu.calls_by_thread)
    for _ in range(steps):
        if engine is not None:
            engine.fetch()
            engine.phase_start("forward")
        gpu.run(0.01)
        if engine is not None:
            engine.phase_start("backward")
        gpu.run(0.02)
        if engine is not None:
            engine.phase_start("optimizer")
            engine.stepped()
        ends.append(time.perf_counter_ns())
    calls = collections.Counter(gpu.calls_by_thread) - before
    if engine is not None:
        engine.close()
    return _median_step_us(ends), calls


#: The plain loop's variants: the bare loop, the floor on the host and with its device calls (charged, or free:
#: the test bed's own Python in place), and perfhooks.
PLAIN_MODES = ("bare", "floor_host", "floor_free", "floor", "perfhooks")


#: Steps each plain-loop run takes before it is timed: at ~0.5 ms a step, past the first second of a run, in which
#: perfhooks creates the device events its pool later recycles (the timing reader returns them
#: every ``READ_EVERY_S``).
WARMUP_STEPS = 1500


def plain_loop(gpu: SimulatedGpu, steps: int, mode: str | bool, out: str, warmup: int = WARMUP_STEPS,
               at_steady: Any = None) -> tuple[float, collections.Counter]:
    import perfhooks

    mode = {True: "perfhooks", False: "bare"}.get(mode, mode)  # type: ignore[call-overload]
    held = mode if mode in ("light", "dark") else None  # every step after the warm-up light, or dark where it may
    if held:
        mode = "perfhooks"
    torch.random.default_generator.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model[0].register_forward_hook(lambda *args: gpu.run(0.01))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 16), torch.randn(4, 1)
    perf = perfhooks.profile(model, optimizer, output_dir=out, **SETTINGS) if mode == "perfhooks" else None
    if held and perf is not None:
        perf.engine.tracker.sampler.hold(0.0)
        perf.engine.tracker.sampler.dark_share = 1.0 if held == "dark" else 0.0
    fetch: Any = contextlib.nullcontext
    if perf is not None:
        fetch = perf.data_wait
    elif mode != "bare":
        floor = Floor(model, optimizer, device=mode != "floor_host")
        fetch = lambda: floor  # noqa: E731
    costs = gpu.call_cost_us
    if mode == "floor_free":
        gpu.call_cost_us = dict.fromkeys(costs, 0.0)
    ends: list[int] = []
    before = gpu.calls_by_thread
    try:
        for step in range(-warmup, steps):
            if step == 0:  # steady from here: perfhooks' event pool is filled by the timing reader's first reads
                before, ends = gpu.calls_by_thread, []
                if at_steady is not None:
                    at_steady()
            with fetch():
                batch = (x, y)
            loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            ends.append(time.perf_counter_ns())
    finally:
        gpu.call_cost_us = costs
    calls = gpu.calls_by_thread - before
    LAST_RUN.clear()
    LAST_RUN["mean_us"] = (ends[-1] - ends[0]) / (len(ends) - 1) / 1e3
    if perf is not None:
        LAST_RUN["overhead"] = perf.engine.tracker.sampler.section()
        perf.close()
    return _median_step_us(ends), calls


#: The last :func:`plain_loop` run's mean step (µs, steps' ends first to last: what throughput pays) and, with
#: perfhooks, its report's ``overhead`` section.
LAST_RUN: dict[str, Any] = {}


def main_thread_calls(calls: collections.Counter, steps: int) -> float:
    """The simulation's calls a step on the training thread, every kind but the user's kernels."""
    return sum(count for (thread, kind), count in calls.items() if thread == "MainThread" and kind != "kernel") / steps


def run_plain_loop(gpu: SimulatedGpu, rounds: int, steps: int) -> None:
    """The plain loop's variants alternating round after round (each round in the reverse order of the last); the
    target is checked on perfhooks' added time less the test bed's own Python, measured in place."""
    calls: dict[str, collections.Counter] = {}
    with tempfile.TemporaryDirectory() as out:
        for mode in PLAIN_MODES:
            plain_loop(gpu, 50, mode, out, warmup=0)  # warm-up: imports, first allocations

        def run(mode: str) -> float:
            step_us, calls[mode] = plain_loop(gpu, steps, mode, out)
            return step_us

        figures = rotate_rounds(PLAIN_MODES, run, rounds)

    def over(mode: str, base: str = "bare") -> list[float]:
        return paired(figures[mode], figures[base])

    def said(deltas: list[float]) -> str:
        return f"{spread(deltas)} µs"

    floor_calls = main_thread_calls(calls["floor"], steps)
    bed_per_call = statistics.median(a - b for a, b in zip(figures["floor_free"], figures["floor_host"],
                                                            strict=True)) / floor_calls
    perf_calls = main_thread_calls(calls["perfhooks"], steps)
    gross = over("perfhooks")
    bed = bed_per_call * perf_calls
    net = statistics.median(gross) - bed
    print(f"plain_loop: bare step {statistics.median(figures['bare']):7.1f} µs")
    print(f"{'':>12}the floor (six boundaries, each taking the time and appending it): +{said(over('floor_host'))}")
    print(f"{'':>12}the floor with its device calls ({floor_calls:.1f} a step, charged): +{said(over('floor'))}; "
          f"the test bed's own Python in place: {bed_per_call:.2f} µs a call (the free floor less the host floor)")
    print(f"{'':>12}perfhooks adds {said(gross)}; beyond the floor with device calls "
          f"{said(over('perfhooks', 'floor'))}")
    verdict = "met" if net <= TARGET_US else "NOT met"
    print(f"{'':>12}perfhooks net of the test bed's Python ({perf_calls:.1f} calls a step x {bed_per_call:.2f} µs = "
          f"{bed:.1f} µs): {net:.1f} µs a step; target <= {TARGET_US:.0f} µs: {verdict}")
    print(f"{'':>12}device calls a step: bare {per_step(calls['bare'], steps)}, "
          f"with perfhooks {per_step(calls['perfhooks'], steps)}")


def charged_us(calls: collections.Counter, costs: dict[str, float]) -> float:
    """µs the training thread's simulated calls were charged."""
    return sum(count * costs.get(kind, 0.0) for (thread, kind), count in calls.items() if thread == "MainThread")


def in_place(gpu: SimulatedGpu, steps: int, rounds: int) -> None:
    """perfhooks' host time a step measured in place, free of the wall clock's drift between runs: the time inside
    its entry points (``ENTRY_POINTS``: what the loop and torch's hooks call), less the time inside the
    simulation's calls made from there, plus what the calls perfhooks added were charged (their cost on an H100,
    counted against the bare loop's). The timers' own cost is in it (13 or so a step, each a frame): the same
    meters around the floor's entry points read it, with the floor's few lines, and the figure beyond the floor's is
    said too. Torch's own cost of calling a hook is not in either (the wall-clock figures hold it)."""
    with metered([(Floor, "mark"), (Floor, "__enter__"), (Floor, "__exit__")]) as meter, \
            tempfile.TemporaryDirectory() as out:
        _, bare_calls = plain_loop(gpu, steps, "bare", out)

        def run(mode: str) -> tuple[float, float]:
            _, counted = plain_loop(gpu, steps, mode, out, at_steady=meter.reset)
            own = (meter.inside_ns - meter.simulation_ns) / steps / 1e3
            return own, (charged_us(counted, gpu.call_cost_us) - charged_us(bare_calls, gpu.call_cost_us)) / steps

        figures = rotate_rounds(("perfhooks", "floor"), run, rounds)

    def median(mode: str, which: int) -> float:
        return statistics.median(figure[which] for figure in figures[mode])

    own, charged, floor = median("perfhooks", 0), median("perfhooks", 1), median("floor", 0)
    mine = [figure[0] for figure in figures["perfhooks"]]
    total = own + charged
    verdict = "met" if total <= TARGET_US else "NOT met"
    print(f"{'':>12}in place: perfhooks' own Python {own:.1f} µs a step (rounds {min(mine):.1f} to {max(mine):.1f}; "
          f"the same meters read {floor:.1f} µs around the floor's marks, so {own - floor:.1f} µs beyond them) + its "
          f"device calls' charged cost {charged:.1f} µs = {total:.1f} µs a step; target <= {TARGET_US:.0f} µs: "
          f"{verdict}")


def budget(gpu: SimulatedGpu, steps: int, rounds: int) -> dict[str, Any]:
    """Issue 65's checks on the simulated launch-bound plain loop, alternating in one process round after round:
    bare; perfhooks with every step after the sampler's warm-up light (``light``: what a light step costs); and
    perfhooks with its defaults (the 1% budget). Each round's figure is its mean step (first step's end to last's:
    what throughput pays); the ratio is perfhooks' over bare's of the same round, and the result the median of the
    rounds' ratios. A light step in place is perfhooks' own meter (the median of its light steps, inside the
    tracker) and the entry points' meter (:func:`metered`, the meters' own cost in it)."""
    modes = ("bare", "light", "dark", "perfhooks")
    with tempfile.TemporaryDirectory() as out:
        for mode in modes:
            plain_loop(gpu, 50, mode, out, warmup=0)

        def run(mode: str) -> dict[str, Any]:
            plain_loop(gpu, steps, mode, out)
            return dict(LAST_RUN)

        runs = rotate_rounds(modes, run, rounds)
        means = {mode: [each["mean_us"] for each in runs[mode]] for mode in modes}
        sections = {mode: [each["overhead"] for each in runs[mode]] for mode in ("light", "dark", "perfhooks")}
        with metered() as meter:
            plain_loop(gpu, steps, "light", out, at_steady=meter.reset)
            entry_us = (meter.inside_ns - meter.simulation_ns) / steps / 1e3

    def ratios(mode: str) -> list[float]:
        return [a / b for a, b in zip(means[mode], means["bare"], strict=True)]

    def said(values: list[float], digits: int = 3) -> str:
        return spread(values, digits)

    light_in_place = statistics.median(section["in_place_us"]["light"] for section in sections["light"])
    bare = statistics.median(means["bare"])
    print(f"budget: {rounds} rounds of {steps} steps, alternating; bare mean step {bare:.1f} µs")
    print(f"{'':>12}a light step in place: {light_in_place:.1f} µs (perfhooks' meter, median); {entry_us:.1f} µs "
          f"inside the entry points, their meters included; target <= 8 µs: "
          f"{'met' if light_in_place <= 8 else 'NOT met'}")
    light_added = paired(means["light"], means["bare"])
    print(f"{'':>12}every step light: +{said(light_added, 1)} µs a step; ratio {said(ratios('light'))}")
    dark_added = paired(means["dark"], means["bare"])
    dark_share = statistics.median(section["dark_steps"] / max(1, section["dark_steps"] + section["light_steps"])
                                   for section in sections["dark"])
    print(f"{'':>12}dark where it may ({dark_share:.0%} of the steps): +{said(dark_added, 1)} µs a step; "
          f"ratio {said(ratios('dark'))}")
    added = paired(means["perfhooks"], means["bare"])
    print(f"{'':>12}the defaults (budget 1%): +{said(added, 1)} µs a step; ratio {said(ratios('perfhooks'))}; "
          f"target <= 1.02: {'met' if statistics.median(ratios('perfhooks')) <= 1.02 else 'NOT met'}")
    last = sections["perfhooks"][-1]
    print(f"{'':>12}its report's overhead (last round): detailed {last['detailed_steps']} of "
          f"{last['detailed_steps'] + last['light_steps']} steps, probability {last['probability']}, in place "
          f"{last['in_place_us']}, share of run {last['share_of_run']}, kept {last['kept']}, paired {last['paired']}")
    print(f"{'':>12}dark steps {last['dark_steps']} (share of blocks {last['dark_share']}); measured "
          f"{last['measured']}")
    shares = [section["measured"]["share"] for section in sections["perfhooks"]]
    resolved = sum(bool(section["measured"]["resolved"]) for section in sections["perfhooks"])
    against = statistics.median(ratios("perfhooks")) - 1
    within = abs(statistics.median(shares) - against) <= 0.01
    print(f"{'':>12}the report's measured share, median of the rounds: {statistics.median(shares):.4f} (rounds "
          f"{min(shares):.4f} to {max(shares):.4f}; resolved in {resolved} of {len(shares)}); against the bare "
          f"rounds: {against:.4f}; within 1 point: {'yes' if within else 'NO'}")
    return {"rounds": rounds, "steps": steps, "bare_mean_us": bare, "light_in_place_us": light_in_place,
            "entry_points_us": entry_us, "light_ratio": statistics.median(ratios("light")),
            "dark_ratio": statistics.median(ratios("dark")), "measured": last["measured"],
            "defaults_ratio": statistics.median(ratios("perfhooks")), "defaults_added_us": statistics.median(added),
            "measured_share": statistics.median(shares), "measured_resolved": resolved}


def _bookkeeping_cuts() -> dict[str, list[tuple[type, str, Any]]]:
    """Each piece of a step's bookkeeping, knocked out: ``(class, method, stand-in)``. Only for a measurement: the
    run's figures are wrong while one is out (the statistics miss steps, other threads see an old state)."""
    from perfhooks.runtime.engine import Engine
    from perfhooks.runtime.step.steps import PendingSteps
    from perfhooks.runtime.step_listener import RunParts

    publish = Engine.publish

    def stale(self: Any, full: bool = False) -> Any:  # the close's full publication still runs
        return publish(self, full) if full or not hasattr(self, "state") else self.state

    return {
        "the statistics (resolved timings folded in)": [(PendingSteps, "add", lambda self, record, stats:
                                                          self._queue.append(record))],
        "a step's end for the other threads": [(RunParts, "step_closed", lambda self: None)],
        "the published state alone": [(Engine, "publish", stale)],
        "the step's open (windows, memory, FLOP arming)": [(RunParts, "step_opening", lambda self, step: False)],
    }


def bookkeeping(gpu: SimulatedGpu, steps: int, rounds: int) -> None:
    """perfhooks' own Python a plain-loop step in place (as :func:`in_place`, the device calls free and their Python
    taken out), whole and with each piece of the step's bookkeeping knocked out in turn, alternating: what each
    piece costs, and what the six boundaries (torch's hook, perfhooks' hook, the phase change, the mark) cost
    without it."""
    cuts = {"none": [], **_bookkeeping_cuts()}
    with metered() as meter, mock.patch.object(gpu, "call_cost_us", dict.fromkeys(gpu.call_cost_us, 0.0)), \
            tempfile.TemporaryDirectory() as out:

        def run(cut: str) -> float:
            with contextlib.ExitStack() as patches:
                for owner, name, stand_in in cuts[cut]:
                    patches.enter_context(mock.patch.object(owner, name, stand_in))
                plain_loop(gpu, steps, "perfhooks", out, at_steady=meter.reset)
            return (meter.inside_ns - meter.simulation_ns) / steps / 1e3

        figures = rotate_rounds(list(cuts), run, rounds)
    print(f"plain_loop, in place, calls free: perfhooks' own Python {spread(figures['none'])} µs a step; "
          f"knocked out in turn:")
    for cut, values in figures.items():
        if cut != "none":  # against the whole run of the same round (the machine drifts between rounds)
            differences = paired(values, figures["none"])
            print(f"{'':>12}{cut}: {statistics.median(differences):+.1f} µs, paired (rounds "
                  f"{min(differences):+.1f} to {max(differences):+.1f})")


def per_step(calls: collections.Counter, steps: int) -> dict[str, float]:
    """Device calls a step, on the training thread and on perfhooks' threads."""
    out: dict[str, float] = collections.defaultdict(float)
    for (thread, kind), count in calls.items():
        if kind in DEVICE_CALLS:
            out["training thread" if thread == "MainThread" else thread] += count / steps
    return {key: round(value, 2) for key, value in sorted(out.items())}


def background_share(gpu: SimulatedGpu, seconds: float = 4.0) -> dict[str, float]:
    """The share of each second perfhooks' threads ran (their CPU time: what they could take of the GIL) while
    a host-bound loop of ~1 ms steps trains: about 1000 steps a second for the timing reader to read."""
    from perfhooks import Engine, PerfConfig

    with tempfile.TemporaryDirectory() as out:
        engine = Engine(PerfConfig(**SETTINGS), out, "bench", device="cuda:0")
        before, started = threads_cpu_s("perfhooks"), time.perf_counter()
        while time.perf_counter() - started < seconds:
            engine.fetch()
            engine.phase_start("forward")
            gpu.run(0.1)
            spin_until = time.perf_counter() + 0.001  # the step's own host work
            while time.perf_counter() < spin_until:
                pass
            engine.phase_start("backward")
            gpu.run(0.2)
            engine.phase_start("optimizer")
            engine.stepped()
        elapsed, after = time.perf_counter() - started, threads_cpu_s("perfhooks")
        steps = engine.step
        engine.close()
    shares = {name: round((after[name] - before.get(name, 0.0)) / elapsed, 4) for name in after}
    shares["steps_per_s"] = round(steps / elapsed)
    return shares


def simulation_overhead_us(gpu: SimulatedGpu, rounds: int = 20000) -> dict[str, float]:
    """The simulation's own Python per call (µs, charged nothing, in a warm loop: a floor on what it adds to a
    step, where its calls run cold), by kind: the part of a measured step that is the test bed, not perfhooks."""
    costs, gpu.call_cost_us = gpu.call_cost_us, dict.fromkeys(gpu.call_cost_us, 0.0)
    try:
        first, second = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream = torch.cuda.current_stream(0)
        first.record(stream)
        second.record(stream)
        calls = {"event_record": lambda: first.record(stream), "event_query": first.query,
                 "elapsed_time": lambda: first.elapsed_time(second),
                 "capture_check": torch.cuda.is_current_stream_capturing,
                 "current_stream": lambda: torch.cuda.current_stream(0),
                 "stream_id": lambda: torch._C._cuda_getCurrentStream(0),
                 "mem_get_info": lambda: torch.cuda.mem_get_info(0), "memory_stats": lambda: torch.cuda.memory_stats(0)}
        out = {}
        for kind, call in calls.items():
            started = time.perf_counter_ns()
            for _ in range(rounds):
                call()
            out[kind] = round((time.perf_counter_ns() - started) / rounds / 1e3, 2)
        return out
    finally:
        gpu.call_cost_us = costs


def test_bed_us(calls: collections.Counter, steps: int, overhead: dict[str, float]) -> float:
    """The simulation's own Python in a step of the training thread (µs): its calls a step × their overhead."""
    return sum(count / steps * overhead.get(kind, 0.0) for (thread, kind), count in calls.items()
               if thread == "MainThread")


def run_engine_loop(gpu: SimulatedGpu, rounds: int, steps: int, overhead: dict[str, float]) -> None:
    """The engine's events alone, bare and with perfhooks alternating; the test bed's Python is taken out by its
    calibration in a warm loop (a tight loop, as this one is)."""
    calls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out:
        engine_loop(gpu, 50, True, out)  # warm-up: imports, first allocations

        def run(name: str) -> tuple[float, float]:
            nonlocal calls
            step_us, counted = engine_loop(gpu, steps, name == "perfhooks", out)
            if name == "perfhooks":
                calls = per_step(counted, steps)
            return step_us, test_bed_us(counted, steps, overhead)

        figures = rotate_rounds(("bare", "perfhooks"), run, rounds)
    bare_us = [step for step, _ in figures["bare"]]
    deltas = paired([step for step, _ in figures["perfhooks"]], bare_us)
    median = statistics.median(deltas)
    # the test bed's Python in perfhooks' calls, net of the bare loop's
    simulation = statistics.mean(paired([bed for _, bed in figures["perfhooks"]], [bed for _, bed in figures["bare"]]))
    print(f"    engine: bare step {statistics.median(bare_us):7.1f} µs; perfhooks adds {spread(deltas)} µs a step, "
          f"of which at least {simulation:.1f} µs is the "
          f"simulation's own Python: {median - simulation:.1f} µs net (the engine's events alone)")
    print(f"{'':>12}device calls a step: with perfhooks {calls}")


# ----------------------------------------------------------------------------- the timing reader's Python
def reader_cost(gpu: SimulatedGpu, rounds: int, steps: int = 400) -> dict[str, Any]:
    """The timing reader's Python a step: ``PendingSteps.resolve`` over ``steps`` steps of six marks each, the
    device calls free (what is left is perfhooks' own work, plus the simulation's call overhead). On CUDA the reader
    holds the GIL for this Python while the training thread may want it (its device calls release it:
    ``DeviceClock.bind_reader``), so each µs here is one a host-bound training thread can lose. The median over
    rounds past the first three (warm-up), and the device calls the reads made a step."""
    from perfhooks.device.clock import DeviceClock
    from perfhooks.device.room import DeviceRoom
    from perfhooks.report.statistics import PhaseStatistics
    from perfhooks.runtime.step.steps import PendingSteps, StepRecord

    def queued(clock: Any) -> PendingSteps:
        """Step records as a plain loop makes them: a data wait whose end is apart from the forward's start, then
        forward, backward and optimizer, each step's end the next one's start."""
        pending = PendingSteps(clock, limit=10 * steps)
        pending.background = True
        handoff = clock.mark()
        for step in range(steps):
            record = StepRecord(step, handoff)
            start = handoff
            for name in ("data_wait", "forward", "backward", "optimizer"):
                end = clock.mark()
                record.intervals.append((name, start, end))
                start = clock.mark() if name == "data_wait" else end
            record.end = start
            handoff = clock.share(record.end)
            pending.push(record)
        return pending

    with mock.patch.object(gpu, "call_cost_us", dict.fromkeys(gpu.call_cost_us, 0.0)):
        clock = DeviceClock(DeviceRoom("cuda:0"))
        clock.step_opening()
        per_step: list[float] = []
        calls: dict[str, float] = {}
        for _ in range(max(rounds, 4)):
            pending = queued(clock)
            before = dict(gpu.calls)
            started = time.thread_time_ns()
            pending.resolve()
            per_step.append((time.thread_time_ns() - started) / steps / 1e3)
            calls = {kind: round((count - before.get(kind, 0)) / steps, 2) for kind, count in gpu.calls.items()
                     if kind in ("event_query", "elapsed_time")}
            pending.collect(PhaseStatistics())
    result = {"resolve_us": statistics.median(per_step[3:]), "rounds": len(per_step) - 3, "calls_per_step": calls}
    print(f"the reader's resolve: {result['resolve_us']:.1f} µs a step (median of {result['rounds']} rounds of "
          f"{steps} steps); device calls a step: {calls}")
    return result


# ----------------------------------------------------------------------------- a host-bound Lightning fit, by part
#: Each Lightning variant: the PerfCallback settings (None: the bare fit), and whether callback hooks are timed.
#: An empty callback is what Lightning's dispatch costs any callback (it calls each of about 24 hooks a step
#: through ``trainer.profiler.profile``); then perfhooks with its defaults but no window, each part off in turn,
#: and everything off but the phases. The default window is left to a GPU: on this CPU build a window asks
#: torch's profiler for CUDA activity it cannot record (``benchmarks/gpu_check.sh`` measures it on a GPT).
NO_WINDOW: dict[str, Any] = {"schedule": None}
LIGHTNING_PARTS: dict[str, tuple[dict[str, Any] | None, bool]] = {
    "bare": (None, False),
    "an empty callback": ({}, False),
    "perfhooks, no window": (NO_WINDOW, True),
    "no memory monitor": ({**NO_WINDOW, "memory": False}, True),
    "no callback timing": (NO_WINDOW, False),
    "no console": ({**NO_WINDOW, "console": False}, True),
    "no on-demand trigger": ({**NO_WINDOW, "on_demand": False}, True),
    "no NVTX": ({**NO_WINDOW, "nvtx": False}, True),
    "phases only": ({**NO_WINDOW, "count_flops": False, "analyze_windows": False, "memory": False,
                     "console": False, "on_demand": False, "nvtx": False}, False),
}
LIGHTNING_SKIP_STEPS = 50


def lightning_fit(gpu: SimulatedGpu, variant: str, steps: int, out: str) -> tuple[float, float]:
    """(steady step, mean step) in µs of one Lightning fit whose host time is the step: a small MLP with
    Lightning's defaults on (logger, checkpoint, progress bar, validation), perfhooks bound to ``cuda:0`` of the
    simulation."""
    import lightning as L

    from helpers import lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    ends: list[int] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            ends.append(time.perf_counter_ns())

    torch.random.default_generator.manual_seed(0)
    model = lightning_mlp()
    model.net[0].register_forward_hook(lambda *args: gpu.run(0.05) if torch.is_grad_enabled() else None)
    settings, timed = LIGHTNING_PARTS[variant]
    callbacks: list[Any] = [Clock()]
    saved = PerfCallback._time_callbacks
    if variant == "an empty callback":
        callbacks.append(type("Empty", (L.Callback,), {})())
    elif settings is not None:
        callbacks.append(PerfCallback(output_dir=Path(out) / variant, **settings))
        if not timed:
            PerfCallback._time_callbacks = lambda self, trainer, engine: None  # type: ignore[method-assign]
    try:
        trainer = L.Trainer(accelerator="cpu", devices=1, default_root_dir=str(Path(out) / "fit"), max_steps=steps,
                            callbacks=callbacks, enable_progress_bar=True, limit_val_batches=2,
                            val_check_interval=steps // 3)
        trainer.fit(model, random_loader(steps), random_loader(2))
    finally:
        PerfCallback._time_callbacks = saved  # type: ignore[method-assign]
    return steady_step(ends, LIGHTNING_SKIP_STEPS) / 1e3, (ends[-1] - ends[0]) / (len(ends) - 1) / 1e3


def lightning_parts(gpu: SimulatedGpu, steps: int, rounds: int) -> dict[str, Any]:
    """What each part of perfhooks costs a host-bound Lightning fit (:data:`LIGHTNING_PARTS`, each a fresh fit, in
    rotating rounds), every device call charged: each variant's steady and mean step less the bare fit's of the
    same round, µs a step, the median over rounds with their range."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as out:
        lightning_fit(gpu, "perfhooks, no window", 60, out)  # warm-up: imports, first allocations
        figures = rotate_rounds(list(LIGHTNING_PARTS), lambda name: lightning_fit(gpu, name, steps, out), rounds)
    bare = figures.pop("bare")
    print(f"bare fit: median step {statistics.median(f[0] for f in bare):.0f} µs, mean "
          f"{statistics.median(f[1] for f in bare):.0f} µs ({steps} steps, {rounds} rounds)")
    added: dict[str, dict[str, float]] = {}
    for name, runs in figures.items():
        steady = paired([run[0] for run in runs], [run[0] for run in bare])
        mean = paired([run[1] for run in runs], [run[1] for run in bare])
        added[name] = {"steady_us": statistics.median(steady), "mean_us": statistics.median(mean)}
        print(f"{name:>20}: median step {spread(steady)} µs added; mean step {spread(mean)} µs added")
    return {"steps": steps, "rounds": rounds, "added": added}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="steps a run (default 400; 600 with --bookkeeping, 2000 with --budget and "
                             "--lightning-parts)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--free", action="store_true", help="device calls cost no host time")
    parser.add_argument("--loops", nargs="+", choices=("engine", "plain_loop"), default=["engine", "plain_loop"],
                        help="the loops to time (default both); an A/B of two commits alternates runs of one")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--budget", action="store_true",
                      help="only the cost budget's checks (issue 65): a light step, and the defaults against "
                           "bare by the median of paired rounds (--rounds 12 or more)")
    only.add_argument("--bookkeeping", action="store_true",
                      help="only the plain loop in place, with each piece of a step's bookkeeping knocked out in "
                           "turn")
    only.add_argument("--reader", action="store_true", help="only the timing reader's Python a step")
    only.add_argument("--lightning-parts", action="store_true",
                      help="only a host-bound Lightning fit with each part of perfhooks off in turn")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    steps = args.steps or (600 if args.bookkeeping else 2000 if args.budget or args.lightning_parts else 400)
    print(describe_machine())
    with on_the_simulated_gpu() as gpu:
        if args.free:
            gpu.call_cost_us = dict.fromkeys(gpu.call_cost_us, 0.0)
        print(f"per-call host cost (µs): {gpu.call_cost_us}")
        if args.bookkeeping:  # the plain loop in place only
            bookkeeping(gpu, steps, args.rounds)
            return
        if args.budget:
            budget(gpu, steps, args.rounds)
            return
        if args.reader:
            reader_cost(gpu, args.rounds)
            return
        if args.lightning_parts:
            lightning_parts(gpu, steps, args.rounds)
            return
        overhead = simulation_overhead_us(gpu)
        print(f"the simulation's own Python per call (µs, warm; charged on top of the costs above): {overhead}")
        if "engine" in args.loops:
            run_engine_loop(gpu, args.rounds, steps, overhead)
        if "plain_loop" in args.loops:
            run_plain_loop(gpu, args.rounds, steps)
            in_place(gpu, steps, args.rounds)
        print(f"background threads' share of each second (CPU time, an upper bound on their GIL time), "
              f"host-bound 1 ms steps: {background_share(gpu)}")


if __name__ == "__main__":
    main()
