"""One published state of the run: the training thread publishes an immutable RunState at each step boundary;
other threads read it and never the live statistics (which a read folds, that is mutates)."""

import sys
import threading
from pathlib import Path

import pytest

from helpers import ManualClock
from perfhooks import Engine, PerfConfig
from perfhooks.events import OTHER, PHASES
from perfhooks.report.statistics import PhaseStatistics, StepTiming

STEPS = 10_000


def _step(engine: Engine, clock: ManualClock, n: int) -> None:
    """One step whose phase times (ms) follow from its number, so a reader can check any state it sees."""
    engine.phase_start("data_wait")
    clock.advance(1 + n % 3)
    engine.phase_start("forward")
    clock.advance(2)
    engine.phase_start("backward")
    clock.advance(3 + n % 2)
    engine.phase_start("optimizer")
    clock.advance(1)
    engine.stepped()
    engine.step_end()


def _expected_total_ms(steps: int) -> float:
    return float(sum(7 + n % 3 + n % 2 for n in range(steps)))


def test_a_reader_thread_sees_no_torn_state_while_10000_steps_run(tmp_path: Path) -> None:
    """Every step detailed (``overhead_budget=None``): each one's phases add up to its time, and ``recent`` holds
    every step."""
    clock = ManualClock()
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory=False, wandb=False,
                               overhead_budget=None), tmp_path, "test", clock=clock)
    seen: list[int] = []
    problems: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            state = engine.state
            try:
                stats = state.stats.thaw()
                steps = stats.steps
                # every published step is resolved and counted in the same state, and nothing else is
                if steps != state.step or state.global_step != state.step:
                    problems.append(f"step {state.step}, global {state.global_step}, resolved {steps}")
                if stats.step.total != pytest.approx(_expected_total_ms(steps)):
                    problems.append(f"{steps} steps total {stats.step.total} ms")
                phase_total = sum(stats.phases[name].total for name in (*PHASES, OTHER))
                if phase_total != pytest.approx(stats.step.total):
                    problems.append(f"{steps} steps: phases {phase_total} ms of {stats.step.total} ms")
                if len(stats.recent) != min(steps, stats.recent.maxlen) or (
                        steps and stats.recent[-1].step != steps - 1):
                    problems.append(f"{steps} steps: recent holds {len(stats.recent)}")
            except Exception as error:  # a torn read raises (a dict or deque changed during iteration)
                problems.append(f"{type(error).__name__}: {error}")
            seen.append(state.step)

    reader = threading.Thread(target=read)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads every few bytecodes: reading the live statistics here tears
    reader.start()
    try:
        for n in range(STEPS):
            _step(engine, clock, n)
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(interval)
    engine.close()
    assert problems == []
    assert len(set(seen)) > 10, "the reader saw states from across the run"
    assert seen == sorted(seen), "states are published in order"
    assert engine.state.step == STEPS and engine.state.status == "completed"


def test_a_snapshot_thaws_to_the_same_statistics_and_is_not_changed_by_later_steps() -> None:
    live = PhaseStatistics(history=100, fold_every=8)
    timings = [StepTiming(n, 10.0 + n, {"forward": 4.0, "backward": 5.0 + n, "other": 1.0}, 1, own=n % 7 == 0,
                          samples=8) for n in range(150)]
    for timing in timings[:101]:
        live.add(timing)
    snapshot = live.snapshot()
    expected = (live.steps, live.step.total, live.steady_step.count, live.samples, [t.step for t in live.recent])
    for timing in timings[101:]:
        live.add(timing)
    live.step.summary()  # folds the live statistics again
    thawed = snapshot.thaw()
    assert snapshot.steps == 101
    assert (thawed.steps, thawed.step.total, thawed.steady_step.count, thawed.samples,
            [t.step for t in thawed.recent]) == expected
    assert thawed.step.quantile(0.5) == pytest.approx(60.0)
    assert snapshot.thaw().steps == 101, "thawing twice gives the same copy"


def test_the_window_end_report_is_built_from_the_published_state(tmp_path: Path) -> None:
    """A window's report is written on the writer thread from the state published at the window's end."""
    from helpers import read_report
    from perfhooks import Schedule

    clock = ManualClock()
    engine = Engine(PerfConfig(schedule=Schedule(skip_first=2, warmup=1, active=2, repeat=1), console=False,
                               analyze_windows=False, first_answer_step=None), tmp_path, "test", clock=clock)
    for n in range(7):
        _step(engine, clock, n)
    engine.writer.flush()
    written = read_report(tmp_path)
    assert written["status"] == "running" and [w["first_step"] for w in written["windows"]] == [3]
    assert written["steps"] == 5  # the state at the window's end: steps 0-4 resolved
    engine.close()
