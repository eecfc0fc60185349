"""A terminating signal that lands while the training thread holds one of perfhooks' own locks cannot hang the
process: the handler takes no lock, the saving runs on perfhooks' signal thread, and the process ends by the signal
as it does without perfhooks (-15), with a ``terminated`` report. Each region is reached for real, with a capture
window open and the report rewritten often (tests/scripts/signal_inside.py sends SIGTERM from inside it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "signal_inside.py"
#: Seconds a run may take before the test calls it hung (it ends in about 2 s; before the fix it hung for ever).
HUNG_AFTER_S = 90


def _run(region: str, perf: bool, out: Path) -> tuple[int, str]:
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), region, "1" if perf else "0", str(out)],
                              capture_output=True, text=True, timeout=HUNG_AFTER_S,
                              env={**os.environ, "WANDB_MODE": "disabled"})
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the process hung after the signal in {region}: {str(hung.stdout)[-2000:]}")
    return done.returncode, done.stdout + done.stderr


def _report(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("region", ["writer_put", "fault_log", "window_record", "window_stop"])
def test_a_signal_inside_perfhooks_lock_ends_the_process_as_plain_and_leaves_the_window(
        tmp_path: Path, region: str) -> None:
    plain_status, _ = _run(region, False, tmp_path / "plain")
    status, output = _run(region, True, tmp_path / "perf")
    assert plain_status == status == -signal.SIGTERM, output[-3000:]
    assert "sending at step" in output and "ran to the end" not in output
    report = _report(tmp_path / "perf")
    said = (report["status"], report.get("signal"), report["steps"], report["faults"], output[-2000:])
    assert (report["status"], report.get("signal")) == ("terminated", "SIGTERM"), said
    assert report["steps"] >= 10, said
    left = [fault for fault in report["faults"] if fault["kind"] == "signal_window"]
    assert left and "left open" in left[0]["message"], said  # the window the signal interrupted is said to be left


@pytest.mark.slow
def test_a_signal_in_the_users_code_saves_the_open_windows_partial_trace(tmp_path: Path) -> None:
    plain_status, _ = _run("user_code", False, tmp_path / "plain")
    status, output = _run("user_code", True, tmp_path / "perf")
    assert plain_status == status == -signal.SIGTERM, output[-3000:]
    report = _report(tmp_path / "perf")
    assert (report["status"], report["signal"]) == ("terminated", "SIGTERM")
    assert not [fault for fault in report["faults"] if fault["kind"].startswith("signal")]
    last = report["windows"][-1]
    assert [w["first_step"] for w in report["windows"]] == [4, 10], "steps 10-13 record: open at the signal"
    assert Path(last["path"]).exists(), "its partial trace was exported on perfhooks' signal thread"
