"""The transformers adapter with a real Trainer on a tiny GPT-2 built from a config."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

from hf_trainer_example import build_trainer
from perfhooks.integrations.transformers import PerfTrainerCallback
from runners import RUNNERS


class LogRecorder(TrainerCallback):
    """Stands in for a report_to integration: records every logs dict it is given."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def test_headline_figures_reach_callbacks_listed_before_it(tmp_path: Path) -> None:
    """With add_to_trainer_logs=True (the default keeps the Trainer's logs its own)."""
    recorder = LogRecorder()
    perf = PerfTrainerCallback(schedule=None, console=False, add_to_trainer_logs=True)
    trainer = build_trainer(str(tmp_path), steps=6, batch_size=2, callback=perf, logging_steps=2)
    trainer.callback_handler.add_callback(recorder)
    handler = trainer.callback_handler
    handler.callbacks.remove(recorder)
    handler.callbacks.insert(1, recorder)  # before ours, like the report_to integrations
    trainer.train()
    step_logs = [logs for logs in recorder.logs if "loss" in logs]
    assert len(step_logs) == 3
    for logs in step_logs:
        assert logs["perf/step_ms"] > 0
        assert 0 < logs["perf/phase/forward_share"] < 1
        assert {"perf/coverage", "perf/phase/data_wait_ms", "perf/phase/optimizer_share"} <= set(logs)
    assert handler.callbacks[0] is perf


def test_default_output_dir_is_under_args_output_dir(tmp_path: Path) -> None:
    trainer = build_trainer(str(tmp_path), steps=2, batch_size=2,
                            callback=PerfTrainerCallback(schedule=None, console=False))
    trainer.train()
    report = json.loads((tmp_path / "_perfhooks" / "report.json").read_text())
    assert report["framework"] == "transformers" and report["steps"] == 2


def test_evaluation_stays_out_of_training_steps(tmp_path: Path) -> None:
    from hf_trainer_example import SyntheticTokens

    class SlowEval(TrainerCallback):
        def on_prediction_step(self, args, state, control, **kwargs):
            time.sleep(0.1)

    trainer = build_trainer(str(tmp_path), steps=6, batch_size=2, eval_strategy="steps", eval_steps=2,
                            per_device_eval_batch_size=2, eval_dataset=SyntheticTokens(8, seed=1),
                            callback=PerfTrainerCallback(schedule=None, console=False))
    trainer.add_callback(SlowEval())
    trainer.train()
    report = json.loads((tmp_path / "_perfhooks" / "report.json").read_text())
    evaluations = [entry for entry in trainer.state.log_history if "eval_runtime" in entry]
    shortest_evaluation_ms = 1e3 * min(e["eval_runtime"] for e in evaluations)
    assert len(evaluations) == 3 and shortest_evaluation_ms >= 400  # four 100 ms batches
    assert report["steps"] == 6
    # The evaluations' time is the run account's (HF's own runtimes, this run), not the steps'
    run = report["run"]
    assert run["evaluations"] == 3
    assert run["evaluation_s"] >= 0.9 * sum(e["eval_runtime"] for e in evaluations), "evaluation counted in steps"


def test_resume_keeps_the_schedule_aligned(tmp_path: Path) -> None:
    from perfhooks import Schedule

    first = build_trainer(str(tmp_path), steps=4, batch_size=2, save_strategy="steps", save_steps=4,
                          callback=PerfTrainerCallback(schedule=None, console=False))
    first.train()
    checkpoint = next(tmp_path.glob("checkpoint-*"))
    callback = PerfTrainerCallback(output_dir=tmp_path / "resumed", console=False,
                                   schedule=Schedule(skip_first=5, wait=0, warmup=0, active=1))
    build_trainer(str(tmp_path), steps=8, batch_size=2, callback=callback).train(resume_from_checkpoint=str(checkpoint))
    report = json.loads((tmp_path / "resumed" / "report.json").read_text())
    assert report["steps"] == 4
    assert [w["first_step"] for w in report["windows"]] == [5]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"max_traces": -1}, ValueError, "max_traces must be an integer >= 1"),
    ({"schedul": None}, TypeError, r"PerfTrainerCallback got unknown argument\(s\) schedul"),
])
def test_bad_arguments_fail_at_construction(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PerfTrainerCallback(**kwargs)


def test_accumulation_sums_micro_batches_into_one_step(tmp_path: Path) -> None:
    RUNNERS["transformers"].run(tmp_path, steps=2, accumulate=4, schedule=None)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == 2 and report["micro_batches"] == 8


# ------------------------------------------------------------------ fidelity with the Trainer's defaults on
def test_evaluation_and_saves_are_apart_from_steps_and_windows(tmp_path: Path, offline_wandb: Path) -> None:
    """eval/save every 10 steps, report_to a real integration (W&B, offline), the progress bar on."""
    from helpers import load_trace, overlaps, trace_spans
    from hf_trainer_example import SyntheticTokens
    from perfhooks import Schedule

    callback = PerfTrainerCallback(console=False, analyze_windows=False,
                                   schedule=Schedule(skip_first=8, warmup=1, active=4))
    trainer = build_trainer(str(tmp_path), steps=20, batch_size=4, callback=callback, eval_strategy="steps",
                            eval_steps=10, save_strategy="steps", save_steps=10, report_to="wandb",
                            logging_steps=5, disable_tqdm=False, per_device_eval_batch_size=4,
                            eval_dataset=SyntheticTokens(32, seed=1))
    save = trainer.model.save_pretrained

    def slow_save(*args, **kwargs):  # a slow filesystem
        time.sleep(0.5)
        return save(*args, **kwargs)

    trainer.model.save_pretrained = slow_save
    trainer.train()
    report = json.loads((tmp_path / "_perfhooks" / "report.json").read_text())

    assert report["steps"] == 20 and report["global_step"] == trainer.state.global_step == 20
    series = report["series"]
    # the step after the window overlaps its trace export (marked); every other fetch is a tiny tensor batch
    assert series["perfhooks"][8:14] == [1] * 6 and sum(series["perfhooks"]) <= 12
    steady_wait = [ms for ms, own in zip(series["data_wait"], series["perfhooks"], strict=True) if not own]
    run = report["run"]
    assert run["evaluations"] == 2 and run["checkpoints"] == 2
    assert run["checkpointing_s"] >= 1.0
    one_save_ms = 1e3 * run["checkpointing_s"] / run["checkpoints"]  # >= 500 ms: 10x a fetch or a step here
    assert max(steady_wait) < one_save_ms / 2, "evaluation or a save counted as data wait"
    # the saves' time is the run account's: two saves of >= 0.5 s each, not the steps' (checked just above)
    parts = run["training_s"] + run["evaluation_s"] + run["checkpointing_s"] + run["other_s"]
    assert parts == pytest.approx(run["wall_s"], rel=0.01)
    ids = [d["id"] for d in report["diagnoses"]]
    # the verdict follows the run's own share (a loaded machine stretches the steps and lowers it)
    from perfhooks.rules.thresholds import Thresholds

    assert ("checkpoint_heavy" in ids) == (run["checkpointing_s"] / run["wall_s"] >= Thresholds().checkpoint_share)
    assert "dataloader_bound" not in ids and "compile_warmup" not in ids
    trace = load_trace(Path(report["windows"][0]["path"]))
    steps = trace_spans(trace, "ProfilerStep#")
    asides = trace_spans(trace, "evaluation") + trace_spans(trace, "checkpoint")
    assert len(steps) == 4 and len(asides) == 2  # the evaluation and the save after step 10
    assert not any(overlaps(step, aside) for step in steps for aside in asides)


def test_a_resumed_run_times_the_skipped_loader(tmp_path: Path) -> None:
    from hf_trainer_example import SyntheticTokens

    fetch_s = 0.02

    class SlowTokens(SyntheticTokens):
        def __getitem__(self, index: int) -> dict:
            time.sleep(fetch_s)  # a floor on each fetch, whatever the machine's load
            return super().__getitem__(index)

    first = build_trainer(str(tmp_path), steps=6, batch_size=2, save_strategy="steps", save_steps=3,
                          callback=PerfTrainerCallback(schedule=None, console=False))
    first.train_dataset = SlowTokens(12)
    first.train()
    callback = PerfTrainerCallback(output_dir=tmp_path / "resumed", schedule=None, console=False)
    resumed = build_trainer(str(tmp_path), steps=6, batch_size=2, callback=callback)
    resumed.train_dataset = first.train_dataset
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    report = json.loads((tmp_path / "resumed" / "report.json").read_text())
    assert report["steps"] == 3 and report["global_step"] == 6
    # every resumed step's fetch from the loader HF rebuilt to skip the first half is data wait: at
    # least its two samples' sleeps (untimed, it would be the step's `other` and data wait ~0)
    assert report["phases"]["data_wait"]["p50_ms"] >= 2 * 1e3 * fetch_s
