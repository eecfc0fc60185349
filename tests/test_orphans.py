"""When a run is taken as left open (perfhooks.runtime.ending.orphans), with a manual clock: its owner collected, the
user's error followed by a long silence, its folder removed; and the watch that closes it, on its own thread."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from perfhooks.faults import FaultLog
from perfhooks.runtime.ending.orphans import AFTER_ERROR_LIMITS, OwnerWatch
from perfhooks.runtime.state.live_watch import LiveWatch


class Owner:
    pass


def test_an_owner_collected_is_a_run_left_open_and_its_signals_go_back_at_once() -> None:
    released: list[str] = []
    watch = OwnerWatch(lambda: released.append("signals"))
    owner = Owner()
    watch.follow(owner, "Trainer")
    assert watch.left_open(0.0, 120.0, error_seen=False, output_removed=False) is None
    del owner
    gc.collect()
    assert watch.left_open(0.0, 120.0, False, False) == "the Trainer running it was garbage-collected"
    assert released == ["signals"], "on the main thread the handlers are put back by the finalizer itself"


def test_silence_after_an_error_or_a_removed_folder_is_a_run_left_open_only_past_its_limit() -> None:
    watch = OwnerWatch(lambda: None)
    limit = 120.0
    assert watch.left_open(AFTER_ERROR_LIMITS * limit, limit, error_seen=True, output_removed=False) is None
    assert "after the error" in str(watch.left_open(AFTER_ERROR_LIMITS * limit + 1, limit, True, False))
    assert watch.left_open(10 * limit, limit, error_seen=False, output_removed=False) is None, "idle is not gone"
    assert watch.left_open(limit, limit, False, output_removed=True) is None
    assert "output folder was removed" in str(watch.left_open(limit + 1, limit, False, True))


def test_the_watch_closes_a_run_left_open_once_and_then_stops(tmp_path: Path, monkeypatch: Any) -> None:
    now = [100.0]
    step = [5]
    closed: list[str] = []
    watch = LiveWatch(rank=0, world_size=1, output_dir=tmp_path, stall_after_s=10.0, console_every_s=0.0,
                      state=lambda: None, phase_now=lambda: (None, None, step[0]), device=lambda: "none",  # type: ignore[arg-type,return-value]
                      on_stall=lambda: None, faults=FaultLog(), clock=lambda: now[0],
                      left_open=lambda idle_s, limit_s: "silence" if idle_s > 3 * limit_s else None,
                      on_left_open=closed.append)
    monkeypatch.setattr(watch, "write_live", lambda *args: None)
    monkeypatch.setattr(watch, "stall_limit", lambda state: 10.0)
    monkeypatch.setattr(watch, "_follow_stall", lambda *args: False)
    watch.tick()
    now[0] += 29.0
    watch.tick()
    step[0] = 6  # a step came: the silence starts again
    now[0] += 2.0
    watch.tick()
    now[0] += 29.0
    watch.tick()
    assert closed == []
    now[0] += 2.0
    watch.tick()
    assert closed == ["silence"] and watch._stop.is_set()
