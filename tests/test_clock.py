"""perfhooks reads its own clock, bound once at import: a test that patches ``time.monotonic`` (Lightning's own
suite counts its calls to gate validation by time; freezegun freezes it) changes nothing of perfhooks, and
perfhooks changes nothing of what the patch sees."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import default_trainer, lightning_mlp, random_loader


def test_perfhooks_makes_no_call_to_a_patched_time_monotonic_in_a_lightning_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As in Lightning's ``test_time_and_epoch_gated_val_check``: a counter in place of ``time.monotonic``.
    The fit calls it as often with ``PerfCallback()`` as without (before: 116 calls against 14)."""
    from perfhooks.integrations.lightning import PerfCallback

    def calls_in_a_fit(callbacks: list[Any], root: Path) -> int:
        calls = [0]
        real = time.monotonic
        # threads an earlier test left in this worker (another library's) are not the fit's: their calls come at
        # their own cadence (a suite run read 17 plain against 15 profiled); the fit's threads, perfhooks' among
        # them, all start after this
        others = {thread.ident for thread in threading.enumerate()} - {threading.get_ident()}

        def counting() -> float:
            if threading.get_ident() not in others:
                calls[0] += 1
            return real()

        with monkeypatch.context() as patch:
            patch.setattr(time, "monotonic", counting)
            trainer = default_trainer(root, max_steps=12, callbacks=callbacks)  # logger, checkpoints, progress bar
            trainer.fit(lightning_mlp(), random_loader(12), random_loader(2))
        return calls[0]

    bare = calls_in_a_fit([], tmp_path / "bare")
    profiled = calls_in_a_fit([PerfCallback(output_dir=tmp_path / "perf", console=False, schedule=None)],
                              tmp_path / "with")
    assert profiled == bare


def test_a_frozen_monotonic_clock_makes_no_stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """60 steps of 50 ms under a frozen ``time.monotonic`` (freezegun's): no stall is declared (before: "stalled
    in forward for 1977 s" and every thread's stack)."""
    from perfhooks import Engine, PerfConfig

    frozen = time.monotonic() - 2000.0
    monkeypatch.setattr(time, "monotonic", lambda: frozen)
    monkeypatch.setattr(time, "monotonic_ns", lambda: int(frozen * 1e9))
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, stall_after_s=1.0), tmp_path, "test")
    for _ in range(60):
        engine.fetch()
        engine.phase_start("forward")
        time.sleep(0.05)
        engine.phase_start("optimizer")
        engine.stepped()
    report = engine.close()
    assert report["steps"] == 60 and report.get("stalls", []) == []
    assert not (tmp_path / "stalls").exists()
    assert report["phases"]["forward"]["p50_ms"] >= 50.0, "timed on perfhooks' own clock"


def test_perfhooks_imported_under_a_mock_binds_the_real_clock() -> None:
    script = ("import time\n"
              "time.monotonic = lambda: 0.0\n"
              "time.monotonic_ns = lambda: 0\n"
              "from perfhooks import timebase\n"
              "a = timebase.monotonic_ns(); time.sleep(0.01); b = timebase.monotonic_ns()\n"
              "assert a > 0 and b - a >= 10_000_000, (a, b)\n"
              "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
