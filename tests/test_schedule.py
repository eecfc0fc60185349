import pytest
import torch.profiler
from hypothesis import given
from hypothesis import strategies as st

from perfhooks import Action, Schedule
from perfhooks.capture.schedule import OnDemandWindow

N, W, A, S = Action.NONE, Action.WARMUP, Action.ACTIVE, Action.ACTIVE_AND_SAVE

TORCH_TO_OURS = {
    torch.profiler.ProfilerAction.NONE: N,
    torch.profiler.ProfilerAction.WARMUP: W,
    torch.profiler.ProfilerAction.RECORD: A,
    torch.profiler.ProfilerAction.RECORD_AND_SAVE: S,
}


@pytest.mark.parametrize(("schedule", "expected"), [
    (Schedule(skip_first=0, wait=1, warmup=1, active=2, repeat=1), [N, W, A, S, N, N, N, N]),
    (Schedule(skip_first=2, wait=0, warmup=1, active=1, repeat=2), [N, N, W, S, W, S, N, N]),
    # repeat really repeats (Lightning #14063): three cycles, then nothing
    (Schedule(skip_first=1, wait=1, warmup=0, active=2, repeat=3), [N, N, A, S, N, A, S, N, A, S, N, N]),
    # repeat=0: forever
    (Schedule(skip_first=0, wait=0, warmup=0, active=1, repeat=0), [S] * 10),
])
def test_schedule_table(schedule: Schedule, expected: list[Action]) -> None:
    assert [schedule(step) for step in range(len(expected))] == expected


def test_default_schedule_opens_one_window_early_after_warmup() -> None:
    schedule = Schedule()
    actions = [schedule(step) for step in range(200)]
    recorded = [step for step, action in enumerate(actions) if action.recording]
    assert recorded == [10, 11, 12]
    assert actions[8:10] == [W, W]
    assert actions.count(S) == 1


def test_steps_are_optimizer_steps_under_gradient_accumulation() -> None:
    """The schedule sees optimizer steps; 4 micro-batches per step do not move it (engine counts steps)."""
    from helpers import ManualClock
    from perfhooks import Engine, PerfConfig

    engine = Engine(PerfConfig(schedule=None, on_demand=False, console=False), "/nonexistent-unused",
                    "test", clock=ManualClock())
    for _ in range(3):
        for _ in range(4):
            engine.phase_start("data_wait")
            engine.phase_start("forward")
            engine.phase_start("backward")
            engine.phase_end("backward")
        engine.phase_start("optimizer")
        engine.step_end()
    assert engine.step == 3
    engine.pending.drain(engine.stats)
    assert engine.stats.micro_batches == 12


@given(skip_first=st.integers(0, 5), wait=st.integers(0, 4), warmup=st.integers(0, 4),
       active=st.integers(1, 4), repeat=st.integers(0, 4))
def test_schedule_matches_torch_profiler_schedule(skip_first: int, wait: int, warmup: int, active: int,
                                                  repeat: int) -> None:
    ours = Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    theirs = torch.profiler.schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    for step in range(60):
        assert ours(step) == TORCH_TO_OURS[theirs(step)], step


@given(first=st.integers(0, 50), warmup=st.integers(0, 3), active=st.integers(1, 5), step=st.integers(0, 80))
def test_on_demand_window_is_one_cycle(first: int, warmup: int, active: int, step: int) -> None:
    window = OnDemandWindow(first, warmup=warmup, active=active)
    brute = Schedule(skip_first=first, wait=0, warmup=warmup, active=active, repeat=1)
    assert window(step) == brute(step)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"active": 0}, "active"),
    ({"wait": -1}, "wait"),
    ({"skip_first": 1.5}, "skip_first"),
    ({"repeat": "2"}, "repeat"),
    ({"warmup": True}, "warmup"),
    ({"active": float("nan")}, "active"),
])
def test_bad_schedule_names_the_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=rf"Schedule {name} must be an integer"):
        Schedule(**kwargs)


@pytest.mark.parametrize("skip_first,wait,warmup,active,repeat",
                         [(0, 0, 0, 1, 0), (8, 0, 2, 3, 1), (3, 5, 1, 2, 2), (0, 4, 0, 3, 0), (10, 2, 2, 1, 3)])
def test_next_action_step_agrees_with_the_schedule(skip_first: int, wait: int, warmup: int, active: int,
                                                   repeat: int) -> None:
    """A quiet run of steps (no step opening) reaches exactly to the schedule's next window, never past it."""
    schedule = Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    for step in range(80):
        expected = next((s for s in range(step, 400) if schedule(s) is not Action.NONE), None)
        assert schedule.next_action_step(step) == expected, step
    window = OnDemandWindow(10, warmup=1, active=3)
    assert [window.next_action_step(s) for s in (0, 10, 12, 13, 14)] == [10, 10, 12, 13, None]
