"""The timing reader's Python per step: ``PendingSteps.resolve`` over 400 steps of six marks each, on the simulated
GPU with its calls free (what is left is perfhooks' own work, plus the simulation's call overhead).

    python benchmarks/reader_cost.py [--rounds 15]

On CUDA the reader holds the GIL for this Python while the training thread may want it (its device calls release
it: ``DeviceClock.bind_reader``), so each µs here is one a host-bound training thread can lose. Prints the median
µs a step over the rounds (the first three are warm-up) and the device calls the reads made.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import describe_machine  # noqa: E402
from simulated_gpu import simulated_cuda  # noqa: E402

STEPS = 400
PHASES = ("data_wait", "forward", "backward", "optimizer")


def queued_steps(clock: object, steps: int) -> object:
    """``steps`` step records as a plain loop makes them: a data wait whose end is apart from the forward's start,
    then forward, backward and optimizer, each step's end the next one's start."""
    from perfhooks.runtime.step.steps import PendingSteps, StepRecord

    pending = PendingSteps(clock, limit=10 * steps)  # type: ignore[arg-type]
    pending.background = True
    handoff = clock.mark()  # type: ignore[attr-defined]
    for step in range(steps):
        record = StepRecord(step, handoff)
        start = handoff
        for name in PHASES:
            end = clock.mark()  # type: ignore[attr-defined]
            record.intervals.append((name, start, end))
            start = clock.mark() if name == "data_wait" else end  # type: ignore[attr-defined]
        record.end = start
        handoff = clock.share(record.end)  # type: ignore[attr-defined]
        pending.push(record)
    return pending


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    from perfhooks.device.clock import DeviceClock
    from perfhooks.device.room import DeviceRoom
    from perfhooks.report.statistics import PhaseStatistics

    print(describe_machine())
    with simulated_cuda(memory_bytes=1 << 30) as gpu:
        gpu.call_cost_us = dict.fromkeys(gpu.call_cost_us, 0.0)
        clock = DeviceClock(DeviceRoom("cuda:0"))
        clock.step_opening()
        per_step = []
        for _ in range(max(args.rounds, 4)):
            pending = queued_steps(clock, STEPS)
            before = dict(gpu.calls)
            started = time.thread_time_ns()
            pending.resolve()  # type: ignore[attr-defined]
            per_step.append((time.thread_time_ns() - started) / STEPS / 1e3)
            calls = {kind: round((count - before.get(kind, 0)) / STEPS, 2) for kind, count in gpu.calls.items()
                     if kind in ("event_query", "elapsed_time")}
            pending.collect(PhaseStatistics())  # type: ignore[attr-defined]
    print(f"the reader's resolve: {statistics.median(per_step[3:]):.1f} µs a step (median of {len(per_step) - 3} "
          f"rounds of {STEPS} steps); device calls a step: {calls}")


if __name__ == "__main__":
    main()
