"""A run its program leaves open closes itself once its owner is gone: an HF ``Trainer`` subclass with its own
``train()`` (Hugging Face's loop, never ``Trainer.train``) raises at step 3, the caller catches the error and drops
the Trainer. Nothing of perfhooks is left (no thread, signal handler, hook or attribute), the report says
``failed``, and a later Ctrl-C in unrelated code raises ``KeyboardInterrupt`` as plain, rewriting nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ctrl_c_state, plain_ctrl_c

SCRIPT = Path(__file__).parents[1] / "scripts" / "left_open.py"


@pytest.mark.slow
def test_a_subclass_run_left_open_by_a_caught_error_leaves_nothing_once_the_trainer_is_dropped(
        tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "WANDB_MODE": "disabled"}, preexec_fn=plain_ctrl_c)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    left = json.loads(next(line for line in lines if line.startswith("{")))
    assert left["patched_while_open"], "the run was open, its attributes on the Trainer, when the error came"
    assert left["threads"] == [] and left["handlers_changed"] == [] and left["forward_hooks"] == 0, left
    assert left["status"] == "failed" and left["steps"] == 3, left
    assert "garbage-collected" in left["error"]["message"]
    assert "KeyboardInterrupt as plain" in lines and "report rewritten: False" in lines, (lines, ctrl_c_state())
