"""One on-demand trigger for every rank, agreed through a real torch.distributed store (HashStore).

Ranks are simulated as watchers in one process sharing one store, polled by hand with a manual clock, so
every outcome is exact. The multi-process runs are in test_distributed_windows.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch.distributed as dist

import perfhooks
from perfhooks.capture.trigger import OnDemandTrigger
from perfhooks.distributed import ranks
from perfhooks.distributed import store as rank_store
from perfhooks.distributed.all_ranks import AllRanksTrigger, StepRate, Target, choose_target, margin_steps
from perfhooks.faults import Once
from perfhooks.runtime.ending import lifecycle


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rank:
    """One simulated rank: its folder, its trigger, its step, its watcher."""

    def __init__(self, store: object, rank: int, folder: Path, clock: ManualClock, window_steps: int = 4,
                 is_free: object = lambda step: True) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.local = OnDemandTrigger(folder, poll_s=1.0, use_signal=False)
        self.watcher = AllRanksTrigger(store, 0, rank, self.local, 1.0, lambda: self.step, window_steps,
                                       is_free, Once(), clock=clock)  # type: ignore[arg-type]

    def touch(self) -> None:
        (self.folder / "TRIGGER").touch()


def _ranks(tmp_path: Path, count: int, **kwargs: object) -> tuple[list[Rank], ManualClock]:
    store = dist.HashStore()
    clock = ManualClock()
    return [Rank(store, r, tmp_path / f"rank{r}", clock, **kwargs) for r in range(count)], clock  # type: ignore[arg-type]


def _advance(ranks_: list[Rank], clock: ManualClock, steps: int, seconds: float = 1.0) -> None:
    """Every rank steps ``steps`` steps in ``seconds``, then polls once."""
    clock.now += seconds
    for rank in ranks_:
        rank.step += steps
        rank.watcher.poll_once()


def test_margin_covers_two_polls_and_slack_at_the_measured_rate() -> None:
    assert margin_steps(10.0, 1.0) == 26  # 10 steps/s * (2 * 1 s + 0.5 s) + 1
    assert margin_steps(0.1, 1.0) == 2  # slow steps: at least 2
    assert choose_target(10, 5, 4, lambda step: True) == 15
    assert choose_target(10, 5, 4, lambda step: not 16 <= step <= 20) == 21  # past a scheduled window


def test_step_rate_is_the_fastest_between_two_polls() -> None:
    rate = StepRate()
    rate.sample(0.0, 0)
    assert rate.rate() is None
    rate.sample(1.0, 0)
    assert rate.rate() is None  # no step in between (a pause): no rate
    rate.sample(2.0, 20)
    assert rate.rate() == 20.0  # the steps after the pause, not the average over it
    rate.sample(3.0, 25)
    assert rate.rate() == 20.0


def test_a_trigger_on_rank_1_gives_every_rank_the_same_window(tmp_path: Path) -> None:
    ranks_, clock = _ranks(tmp_path, 2)
    _advance(ranks_, clock, 10)  # 10 steps/s: the rate is known from the second poll
    ranks_[1].touch()
    _advance(ranks_, clock, 10)  # rank 0 polls first: nothing yet; rank 1 publishes step 20 + 26
    assert [list(r.watcher.targets) for r in ranks_] == [[], [Target(46, 1, 0)]]
    _advance(ranks_, clock, 10)  # rank 0 learns it at its next poll, at step 30: in time
    assert [list(r.watcher.targets) for r in ranks_] == [[Target(46, 1, 0)], [Target(46, 1, 0)]]
    assert not (ranks_[1].folder / "TRIGGER").exists()


def test_ranks_triggered_at_once_agree_on_one_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks 1 and 2 both offer window 0 before either has seen the other's offer (rank 2's check of the store
    came just before rank 1's compare_set): the first offer wins on every rank."""
    ranks_, clock = _ranks(tmp_path, 4)
    _advance(ranks_, clock, 10)
    ranks_[1].touch()
    ranks_[2].touch()
    ranks_[2].step += 3  # rank 2 is 3 steps ahead: its own offer would be step 49
    monkeypatch.setattr(ranks_[2].watcher, "_learn", lambda: None)  # its look at the store found nothing yet
    _advance(ranks_, clock, 10)
    monkeypatch.undo()
    _advance(ranks_, clock, 10)
    seen = [list(r.watcher.targets) for r in ranks_]
    assert all(targets == [Target(46, 1, 0)] for targets in seen), seen


def test_a_trigger_while_a_window_is_pending_joins_it(tmp_path: Path) -> None:
    ranks_, clock = _ranks(tmp_path, 2)
    _advance(ranks_, clock, 10)
    ranks_[0].touch()
    _advance(ranks_, clock, 10)
    ranks_[1].touch()  # before the window at 46 ended: no second window
    _advance(ranks_, clock, 10)
    _advance(ranks_, clock, 10)
    assert [list(r.watcher.targets) for r in ranks_] == [[Target(46, 0, 0)], [Target(46, 0, 0)]]
    ranks_[1].touch()  # after it ended (step 50 > 49): a second window
    _advance(ranks_, clock, 10)
    _advance(ranks_, clock, 10)
    assert [list(r.watcher.targets)[-1] for r in ranks_] == [Target(76, 1, 1)] * 2  # 50 + 26


def test_no_rate_yet_waits_for_the_next_poll(tmp_path: Path) -> None:
    ranks_, clock = _ranks(tmp_path, 2)
    ranks_[0].touch()
    _advance(ranks_, clock, 10)  # one sample only: no rate, the request is kept
    assert not ranks_[0].watcher.targets
    _advance(ranks_, clock, 10)
    assert list(ranks_[0].watcher.targets) == [Target(46, 0, 0)]


class CountingStore:
    """A real HashStore; every call counted with the thread that made it."""

    def __init__(self) -> None:
        self.store = dist.HashStore()
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> object:
        method = getattr(self.store, name)

        def counted(*args: object) -> object:
            self.calls.append((threading.current_thread().name, name))
            return method(*args)

        return counted


def test_the_engine_opens_the_agreed_window_and_its_training_thread_makes_no_store_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder) -> None:
    """An engine in a 2-rank run (rank 1 simulated by a watcher on the same store) that rank 1 triggers: the
    window opens at the agreed step, labelled ProfilerStep#N with N the agreed steps; the training thread made
    no store call (the watcher thread made them all)."""
    import torch

    store = CountingStore()
    monkeypatch.setattr(rank_store, "default_store", lambda: store)
    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    config = perfhooks.PerfConfig(schedule=None, console=False, analyze_windows=False, wandb=False, memory=False,
                                  trigger_poll_s=0.05, on_demand_active=2)
    engine = perfhooks.Engine(config, tmp_path / "rank0", "test")
    # rank 1 is no process: no summary to wait for
    monkeypatch.setattr(lifecycle, "gather_ranks", lambda *args, **kwargs: None)
    clock = ManualClock()
    clock.now = 5.0
    other = Rank(store.store, 1, tmp_path / "rank1", clock, window_steps=3)  # its calls are not counted
    model = torch.nn.Linear(8, 8)
    published = False
    for step in range(400):
        if engine.windows.windows:
            break
        if step == 5:
            other.step = step
            other.watcher.rate.sample(0.0, 0)  # 1 step/s, polls 1 s apart: a margin of 4 steps
            other.touch()
            other.watcher.poll_once()
            published = True
        engine.phase_start("forward")
        model(torch.randn(4, 8)).sum().backward()
        engine.step_end()
        threading.Event().wait(0.1)  # 4 steps: 8 of the engine's polls
    engine.all_ranks.targets.append(Target(3, 1, 1))  # a window this rank learns of too late
    engine.phase_start("forward")
    engine.step_end()
    engine.close()
    assert published
    (target,) = other.watcher.targets
    assert target == Target(9, 1, 0)
    (window,) = engine.windows.windows  # warm-up at step 9, then 2 recorded steps
    assert (window["first_step"], window["last_step"], window["trigger"]) == (10, 11, "on_demand")
    said = [str(w.message) for w in recwarn]
    assert any("window at step 3 (asked for by rank 1) is not recorded on rank 0: this rank was already at step"
               in message for message in said), said
    training = threading.main_thread().name
    assert store.calls and all(thread != training for thread, _ in store.calls), store.calls


def test_sigusr2_to_one_rank_publishes_for_every_rank(tmp_path: Path) -> None:
    import os
    import signal

    store = dist.HashStore()
    clock = ManualClock()
    quiet = Rank(store, 0, tmp_path / "rank0", clock)
    signalled = OnDemandTrigger(tmp_path / "rank1", poll_s=1.0, use_signal=True)
    step = {"now": 0}
    watcher = AllRanksTrigger(store, 0, 1, signalled, 1.0, lambda: step["now"], 4, lambda s: True, Once(),
                              clock=clock)
    try:
        for _ in range(2):
            clock.now += 1.0
            step["now"] += 10
            quiet.step += 10
            watcher.poll_once()
            quiet.watcher.poll_once()
            if _ == 0:
                os.kill(os.getpid(), signal.SIGUSR2)  # the handler only sets a flag; the watcher publishes
    finally:
        signalled.close()
    assert list(watcher.targets) == [Target(46, 1, 0)] and list(quiet.watcher.targets) == [Target(46, 1, 0)]


def test_a_store_that_stops_answering_falls_back_to_this_ranks_own_trigger(tmp_path: Path) -> None:
    """Rank 0's process serves the store; when it ends first, the others' watchers lose it: they say so once and
    stop, and the engine goes back to the rank's own trigger (no fault: this is how jobs end)."""

    class GoneStore:
        def check(self, keys: list[str]) -> bool:
            raise RuntimeError("Connection reset by peer")

    local = OnDemandTrigger(tmp_path, poll_s=0.01, use_signal=False)
    watcher = AllRanksTrigger(GoneStore(), 0, 1, local, 0.01, lambda: 0, 4, lambda s: True, Once())
    with pytest.warns(UserWarning, match="store stopped answering .RuntimeError: Connection reset by peer.; an on-"
                                         "demand trigger now opens a window on rank 1 only"):
        watcher.start()
        watcher._thread.join(5)  # type: ignore[union-attr]
    assert watcher.lost


def test_a_store_lost_after_the_close_is_not_said(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    """A store call in flight when the run closes (the close waits for it 1 s at most) fails once rank 0 has ended:
    the daemon thread returns without a word. Its warning could reach stderr during the interpreter's shutdown,
    which aborts the process (a rank died of SIGABRT once, under two CPU hogs)."""
    inside, fail = threading.Event(), threading.Event()

    class StoreEndingAfterTheClose:
        def check(self, keys: list[str]) -> bool:
            inside.set()
            fail.wait(5)
            raise RuntimeError("Connection reset by peer")

    local = OnDemandTrigger(tmp_path, poll_s=0.01, use_signal=False)
    watcher = AllRanksTrigger(StoreEndingAfterTheClose(), 0, 1, local, 0.01, lambda: 0, 4, lambda s: True, Once())
    watcher.start()
    thread = watcher._thread
    assert inside.wait(5)
    watcher.close(timeout_s=0.01)
    assert thread is not None and thread.is_alive(), "the close did not wait for the call in flight"
    fail.set()
    thread.join(5)
    assert watcher.lost and not [w for w in recwarn if "store stopped answering" in str(w.message)]


def test_the_engine_goes_back_to_its_own_trigger_when_the_store_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    class GoneStore:
        def check(self, keys: list[str]) -> bool:
            raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(rank_store, "default_store", lambda: GoneStore())
    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    monkeypatch.setattr(lifecycle, "gather_ranks", lambda *args, **kwargs: None)
    config = perfhooks.PerfConfig(schedule=None, console=False, analyze_windows=False, wandb=False, memory=False,
                                  trigger_poll_s=0.05, on_demand_active=2)
    with pytest.warns(UserWarning, match="store stopped answering"):
        engine = perfhooks.Engine(config, tmp_path, "test")
        model = torch.nn.Linear(8, 8)
        for step in range(60):
            if step == 10:
                (tmp_path / "TRIGGER").touch()
            engine.phase_start("forward")
            model(torch.randn(4, 8)).sum().backward()
            engine.step_end()
            threading.Event().wait(0.02)
        engine.close()
    assert engine.all_ranks is None
    (window,) = engine.windows.windows
    assert window["trigger"] == "on_demand" and window["first_step"] >= 11


def test_a_window_the_run_ends_before_is_said_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           recwarn: pytest.WarningsRecorder) -> None:
    """Rank 1 asks at step 6 for a window every rank agrees to start at step 27; the run ends at step 30 on this
    rank before recording it (the on-demand window records from its second step): said once, and in the report."""
    store = dist.HashStore()
    monkeypatch.setattr(rank_store, "default_store", lambda: store)
    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    monkeypatch.setattr(lifecycle, "gather_ranks", lambda *args, **kwargs: None)
    config = perfhooks.PerfConfig(schedule=None, console=False, analyze_windows=False, wandb=False, memory=False,
                                  trigger_poll_s=60.0)
    engine = perfhooks.Engine(config, tmp_path / "rank0", "test")
    engine.all_ranks.targets.append(Target(29, 1, 0, asked_step=6))
    for _ in range(30):
        engine.phase_start("forward")
        engine.step_end()
    report = engine.close()
    assert report is not None and report["windows"] == []
    assert report["missed_windows"] == [{"first_step": 29, "asked_step": 6, "by_rank": 1, "ended_at_step": 30}]
    said = [str(w.message) for w in recwarn]
    assert any("the on-demand window asked for at step 6 by rank 1 was to start at step 29; the run ended at step "
               "30: nothing was recorded" in message for message in said), said
    assert Target.decode(Target(29, 1, 0, asked_step=6).encode(), 0).asked_step == 6
    assert Target.decode("29:1", 0) == Target(29, 1, 0)  # a target offered by an older perfhooks
