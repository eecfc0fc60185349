"""Issue 41: what 13 public scripts and two frameworks' own suites showed, each reproduced on a real framework run
with its defaults on, and fixed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from helpers import read_report


def hf_trainer(output_dir: Path, steps: int, callback: Any, **args: Any) -> Any:
    """A real Trainer on a tiny GPT-2, with transformers' defaults for logging, tqdm and report_to."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import Trainer, TrainingArguments

    from hf_trainer_example import SyntheticTokens, tiny_gpt2

    settings: dict[str, Any] = dict(output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=2,
                                    save_strategy="no", use_cpu=True, logging_steps=2)
    settings.update(args)
    return Trainer(model=tiny_gpt2(), args=TrainingArguments(**settings), train_dataset=SyntheticTokens(steps * 2),
                   eval_dataset=SyntheticTokens(8), callbacks=[callback] if callback is not None else None)


# ----------------------------------------------------------------------------- item 1: the run account
def test_an_evaluation_before_the_first_step_keeps_the_run_account_under_100_percent(tmp_path: Path) -> None:
    from perfhooks.integrations.transformers import PerfTrainerCallback

    trainer = hf_trainer(tmp_path, 6, PerfTrainerCallback(console=False, schedule=None), eval_on_start=True,
                         eval_strategy="steps", eval_steps=3)
    trainer.train()
    run = read_report(tmp_path / "_perfhooks")["run"]
    assert run["evaluations"] == 3  # on start, at step 3 and at step 6
    assert run["training_s"] + run["evaluation_s"] + run["checkpointing_s"] <= run["wall_s"] * 1.0001
    assert sum(run["shares"].values()) == pytest.approx(1.0, abs=1e-4)


# ----------------------------------------------------------------------------- item 7: no step completed
def test_a_run_that_fails_before_its_first_step_says_so_in_one_line(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import lightning.pytorch as pl

    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    class FailsAtOnce(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            raise ValueError("the user's error before step 1")

    trainer = default_trainer(tmp_path, max_steps=4, callbacks=[FailsAtOnce(), PerfCallback(wandb=False)])
    with pytest.raises(ValueError, match="before step 1"):
        trainer.fit(lightning_mlp(), random_loader(4), random_loader(2))
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() + captured.out.splitlines()
            if line.startswith("perfhooks:") or line.startswith("  ")]
    perf_lines = [line for line in said if line.startswith("perfhooks:")]
    assert perf_lines == ["perfhooks: no training step completed (Run FAILED at step 0 (data_wait): ValueError: "
                          "the user's error before step 1); no figures to report"], said
    assert not [line for line in said if "0.000" in line]  # before: a full table of 0.000 rows
    folder = next(tmp_path.rglob("report.json")).parent
    page = (folder / "report.html").read_text()
    assert "at step None" not in page and "(None)" not in page
