"""Every ``--format json`` (or ``--json``) command writes only JSON on standard output, whatever third-party
packages print while it runs: with ``WANDB_MODE=offline`` set (common on clusters) transformers prints
"[INFO] Running in WANDB offline mode" when ``doctor`` imports it; that line goes to standard error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import path
from perfhooks.cli import main

NW0 = "resnet50_num_workers_0.worker0.1623143089861.pt.trace.json.gz"
NW4 = "resnet50_num_workers_4.worker0.1623212756351.pt.trace.json.gz"


def _stdout(*arguments: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-m", "perfhooks", *arguments], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


@pytest.mark.slow
def test_doctor_json_parses_with_wandb_offline_and_the_third_party_line_goes_to_stderr() -> None:
    stdout, stderr = _stdout("doctor", "--format", "json")
    assert json.loads(stdout)["perfhooks_doctor"] == 1
    assert "Running in WANDB offline mode" in stderr, "the line transformers prints on import was moved, not lost"


@pytest.mark.slow
def test_analyze_diff_and_top_json_parse_with_wandb_offline(tmp_path: Path) -> None:
    assert json.loads(_stdout("analyze", str(path(NW0)), "--format", "json")[0])["schema_version"]
    assert "step_ms" in json.loads(_stdout("diff", str(path(NW0)), str(path(NW4)), "--format", "json")[0])
    live = {"rank": 0, "updated_at": time.time(), "status": "running", "step": 3, "phase": "forward",
            "in_phase_s": 0.1, "stalled": False, "stack": [], "shares": {}, "stalls": []}
    (tmp_path / "live.rank0.json").write_text(json.dumps(live))
    assert json.loads(_stdout("top", "--once", "--json", str(tmp_path))[0])["ranks"][0]["rank"] == 0


def test_a_print_while_a_json_command_runs_goes_to_stderr(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: what anything prints during the command is on stderr, the document alone on stdout; a text
    command's prints stay where they were."""
    import perfhooks.cli.doctor as doctor

    real_run = doctor.run

    def noisy(*args: object, **kwargs: object) -> int:
        print("[INFO] a third-party line")
        return real_run(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(doctor, "run", noisy)
    assert main(["doctor", "--format", "json"]) in (0, 1)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["perfhooks_doctor"] == 1
    assert "[INFO] a third-party line" in captured.err
