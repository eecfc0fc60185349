"""The framework's own step counter places an error and a signal, whatever the order of the callbacks: the
framework counts a step before perfhooks' callback hears of it, and another callback can raise, or a signal land,
in between."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from helpers import lightning_mlp, random_loader
from perfhooks.integrations.lightning import PerfCallback

SCRIPT = Path(__file__).parents[1] / "scripts" / "hf_signal_at_step.py"


class FailAt3(L.Callback):
    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == 3:
            raise RuntimeError("the user's error at step 3")


@pytest.mark.parametrize("perf_first", [True, False])
def test_error_step_is_the_frameworks_step_whatever_the_callback_order(tmp_path: Path, perf_first: bool) -> None:
    perf = PerfCallback(output_dir=tmp_path / "perf", console=False)
    callbacks = [perf, FailAt3()] if perf_first else [FailAt3(), perf]
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=10, callbacks=callbacks, accelerator="cpu",
                        devices=1, limit_val_batches=2, val_check_interval=5)
    with pytest.raises(RuntimeError, match="step 3"):
        trainer.fit(lightning_mlp(), random_loader(10), random_loader(2))
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    assert report["status"] == "failed" and report["error"]["step"] == 3 == trainer.global_step


@pytest.mark.slow
def test_a_signal_between_the_frameworks_count_and_perfhooks_marks_the_step_unfinished(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "WANDB_MODE": "disabled"})
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    report = json.loads((tmp_path / "_perfhooks" / "report.json").read_text())
    assert (report["status"], report["signal"]) == ("terminated", "SIGTERM")
    assert (report["global_step"], report["steps"], report.get("unfinished_steps")) == (5, 4, 1), report["steps"]
