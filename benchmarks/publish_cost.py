"""What the published state and the live watch cost the training thread.

    python benchmarks/publish_cost.py

The training thread publishes one RunState per step (``Engine.publish``); the watch thread, once a second, reads
it, follows stalls and (every 2 s) writes the live file, holding the GIL while it does. Both are timed here on an
engine with 5,000 steps of statistics (a manual clock: no sleeping), so the figures do not drown in the noise of
an end-to-end A/B of whole training steps (``overhead.py``'s alternating ratio moves by several percent from
pair to pair on this machine). Target: publish under 5 us a step; a look under 0.5% of a core.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "benchmarks")]

from common import describe_machine  # noqa: E402

from helpers import ManualClock  # noqa: E402
from perfhooks import Engine, PerfConfig  # noqa: E402


def main() -> int:
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as out:
        engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, wandb=False), out, "benchmark",
                        clock=clock)
        for n in range(5000):
            for phase, ms in (("data_wait", 1), ("forward", 2 + n % 5), ("backward", 3), ("optimizer", 1)):
                engine.phase_start(phase)
                clock.advance(ms)
            engine.stepped()
            engine.step_end()
        started = time.perf_counter()
        for _ in range(20_000):
            engine.publish()
        publish_us = (time.perf_counter() - started) / 20_000 * 1e6
        engine.watch.close()  # looked at by hand below
        looks = []
        for _ in range(50):
            engine.watch._next_live = 0.0  # every look writes the live file (the thread does so every other look)
            started = time.perf_counter()
            engine.watch.tick()
            looks.append(time.perf_counter() - started)
        engine.close()
    look_ms = statistics.median(looks) * 1e3
    print(f"machine: {describe_machine()}")
    print(f"publish: {publish_us:.2f} us a step (target 5 us); a watch look with the live file: {look_ms:.2f} ms once "
          f"a second, {look_ms / 10:.3f}% of a core (target 0.5%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
