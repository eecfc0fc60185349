"""Issue 26: the defects that real scripts and the frameworks' own test suites found, each reproduced as a user
would meet it (the frameworks' defaults on), and fixed."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from helpers import default_trainer, lightning_mlp, random_loader, read_report


# ----------------------------------------------------------------------------- item 6: instance patches
def test_a_users_patch_on_the_trainer_is_put_back(tmp_path: Path) -> None:
    """Lightning's own test_model_checkpoint.py patches ``trainer.save_checkpoint`` before fit: the patch is
    still there after the fit, was called, and leaving ``patch.object`` finds its attribute."""
    from perfhooks.integrations.lightning import PerfCallback

    trainer = default_trainer(tmp_path, max_steps=4, callbacks=[PerfCallback(console=False)])
    with mock.patch.object(trainer, "save_checkpoint", wraps=trainer.save_checkpoint) as save:
        trainer.fit(lightning_mlp(), random_loader(4), random_loader(2))
        assert trainer.save_checkpoint is save and save.call_count == 1
    assert "save_checkpoint" not in trainer.__dict__
    assert read_report(tmp_path / "lightning_logs" / "version_0" / "perfhooks")["run"]["checkpoints"] == 1


def test_restoring_puts_back_what_the_instance_held() -> None:
    from perfhooks.runtime.hooks.patches import InstancePatches

    class Owner:
        def method(self) -> str:
            return "class"

    owner = Owner()

    def users() -> str:
        return "user's"

    def replaced() -> str:
        return "replaced during the run"

    owner.method = users  # type: ignore[method-assign]
    patches = InstancePatches()
    patches.set(owner, "method", lambda: "perfhooks")
    patches.set(owner, "other", lambda: "perfhooks")
    patches.restore()
    assert owner.method is users and "other" not in owner.__dict__
    patches.set(owner, "method", lambda: "perfhooks")
    owner.method = replaced  # type: ignore[method-assign]
    patches.restore()
    assert owner.method is replaced


# ----------------------------------------------------------------------------- items 1-2: the launcher
SCRIPTS = Path(__file__).parent / "scripts" / "launched"


def test_the_launcher_profiles_accelerate_after_a_find_spec(tmp_path: Path) -> None:
    """transformers calls importlib.util.find_spec("accelerate") to see whether it is installed; the real
    import that follows still gets perfhooks, and so does a submodule imported before its package."""
    from test_launch import launch, own_lines, report

    done = launch("--no-wandb", "--no-console", str(SCRIPTS / "accelerate_after_find_spec.py"), str(tmp_path), "4")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not any("nothing was profiled" in line for line in own_lines(done.stderr))
    result = report(tmp_path / "perfhooks_out")
    assert (result["framework"], result["steps"]) == ("accelerate", 4)


def test_a_finder_keeps_its_hook_until_the_module_runs() -> None:
    import sys
    import types

    from perfhooks.cli.launch import PostImportHooks

    seen: list[types.ModuleType] = []
    hooks = PostImportHooks()
    hooks.add("json.tool", seen.append)  # not imported yet in this process
    sys.modules.pop("json.tool", None)
    hooks.install()
    try:
        import importlib.util

        assert importlib.util.find_spec("json.tool") is not None and seen == []
        import json.tool  # noqa: F401

        assert [module.__name__ for module in seen] == ["json.tool"]
    finally:
        hooks.remove()


@pytest.mark.parametrize("script", ["fails_at_the_top.py", "syntax_error.py"])
def test_a_script_that_fails_before_training_ends_with_its_own_traceback(tmp_path: Path, script: str) -> None:
    """perfhooks' notice comes first; the traceback is the one python prints, with no runpy frame, and last."""
    from test_launch import launch, own_lines, plain

    target = tmp_path / script
    source = SCRIPTS / script if (SCRIPTS / script).exists() else SCRIPTS / f"{script}.txt"
    target.write_text(source.read_text())
    with_perfhooks, without = launch(str(target)), plain(str(target))
    assert with_perfhooks.returncode == without.returncode == 1
    lines = own_lines(with_perfhooks.stderr)
    assert lines[0].startswith("perfhooks run: no Lightning Trainer")
    assert lines[1:] == own_lines(without.stderr)


# ----------------------------------------------------------------------------- items 9-11: transformers
def _hf_trainer(output_dir: Path, steps: int, callback: Any, **args: Any) -> Any:
    """A real Trainer on a tiny GPT-2, with transformers' defaults for logging, tqdm and report_to."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import Trainer, TrainingArguments

    from hf_trainer_example import SyntheticTokens, tiny_gpt2

    settings: dict[str, Any] = dict(output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=2,
                                    save_strategy="no", use_cpu=True, logging_steps=2)
    settings.update(args)
    return Trainer(model=tiny_gpt2(), args=TrainingArguments(**settings),
                   train_dataset=SyntheticTokens(steps * 2), callbacks=[callback] if callback is not None else None)


def _perfhooks_threads() -> list[str]:
    import threading

    return [thread.name for thread in threading.enumerate() if thread.name.startswith("perfhooks")]


def test_a_caught_error_in_train_ends_the_run_there(tmp_path: Path) -> None:
    """The user catches train()'s error: by then hooks, wrapped methods and threads are gone and the report says
    failed; the retry is a run of its own."""
    import tempfile

    from perfhooks.integrations.transformers import PerfTrainerCallback

    threads_before = _perfhooks_threads()
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        trainer = _hf_trainer(Path(folder), 6, PerfTrainerCallback(console=False, schedule=None), disable_tqdm=True)
        model = trainer.model
        calls = {"n": 0}

        def fail_third(module: Any, args: Any) -> None:
            calls["n"] += 1
            if calls["n"] == 3:
                raise ValueError("user error")

        hook = model.register_forward_pre_hook(fail_third)
        with pytest.raises(ValueError, match="user error"):
            trainer.train()
        wrapped = {"get_batch_samples", "training_step", "compute_loss", "evaluate", "_save_checkpoint"}
        assert not wrapped & set(vars(trainer))  # the run's wrapped methods are put back
        assert list(model._forward_pre_hooks) == [hook.id] and not model._forward_hooks
        assert _perfhooks_threads() == threads_before
        report = read_report(Path(folder) / "_perfhooks")
        assert (report["status"], report["error"]["type"]) == ("failed", "ValueError")
        hook.remove()
        trainer.train()  # the retry: a run of its own, completed
        assert read_report(Path(folder) / "_perfhooks")["status"] == "completed"
    from perfhooks.runtime.ending import exit_guard

    exit_guard._at_exit()
    assert not Path(folder).exists()


def test_a_folder_the_user_removed_is_not_made_again(tmp_path: Path) -> None:
    import shutil

    from helpers import plain_loop
    from perfhooks import Engine, PerfConfig

    removed = tmp_path / "user_folder"
    removed.mkdir()
    engine = Engine(PerfConfig(schedule=None, console=False), removed / "perfhooks", framework="plain")
    plain_loop(engine, 3)
    shutil.rmtree(removed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.close()
    assert not removed.exists()
    lines = [str(w.message) for w in caught if "removed" in str(w.message)]
    assert len(lines) == 1 and str(removed) in lines[0]


def test_the_trainers_logs_and_printed_lines_are_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """By default nothing is added to the Trainer's logs: its printed lines and every report_to tracker get what
    they get without perfhooks. ``add_to_trainer_logs=True`` sends the figures to them too."""
    from transformers import TrainerCallback

    from perfhooks.integrations.transformers import PerfTrainerCallback

    class LogRecorder(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            self.logs.append(dict(logs or {}))

    recorded, printed = {}, {}
    for option in (False, True):
        recorder = LogRecorder()
        trainer = _hf_trainer(tmp_path / str(option), 4, PerfTrainerCallback(console=False, schedule=None,
                                                                             add_to_trainer_logs=option))
        trainer.add_callback(recorder)
        trainer.train()
        recorded[option] = [logs for logs in recorder.logs if "loss" in logs]
        printed[option] = capsys.readouterr().out
    assert recorded[False] and not any(key.startswith("perf/") for logs in recorded[False] for key in logs)
    assert "'loss'" in printed[False] and "perf/" not in printed[False]  # the Trainer's own log lines
    assert all(logs["perf/step_ms"] > 0 for logs in recorded[True])


def test_the_end_of_run_table_starts_on_a_fresh_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' progress bar (tqdm, on stderr) is still open at on_train_end: the table starts on its own
    line, whichever way the callback was added."""
    from perfhooks.integrations.transformers import PerfTrainerCallback

    for added_after in (False, True):
        callback = PerfTrainerCallback(schedule=None)
        trainer = _hf_trainer(tmp_path / str(added_after), 3, None if added_after else callback)
        if added_after:
            trainer.add_callback(callback)
        trainer.train()
        err = capsys.readouterr().err
        table = err.index("perfhooks: 3 steps")
        assert err[table - 1] == "\n", err[max(0, table - 80):table + 20]


# ----------------------------------------------------------------------------- items 3-5: accelerate
def _accelerate_loop(accelerator: Any, steps: int, train_mode: bool = True) -> Any:
    from helpers import mlp

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, random_loader(steps))
    return model, optimizer, loader


def test_training_with_the_model_in_eval_mode_is_training(tmp_path: Path) -> None:
    """Fine-tuning with dropout/BatchNorm frozen (model.eval()): every iteration that steps an optimizer is a
    training step, none is evaluation."""
    from accelerate import Accelerator

    from perfhooks.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = _accelerate_loop(accelerator, 12)
    model.eval()
    with attach(accelerator, output_dir=tmp_path, console=False, schedule=None):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    report = read_report(tmp_path)
    assert report["run"]["evaluations"] == 0 and report["run"]["evaluation_s"] == 0
    assert report["steps"] >= 11  # the first iteration is known to be training only at its backward
    assert report["phases"]["forward"]["mean_ms"] > 0 and report["phases"]["data_wait"]["mean_ms"] > 0


def test_an_evaluation_loop_in_eval_mode_is_still_evaluation(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from perfhooks.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = _accelerate_loop(accelerator, 6)
    evaluation = accelerator.prepare(random_loader(3))
    with attach(accelerator, output_dir=tmp_path, console=False, schedule=None):
        for x, y in loader:
            model.train()
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            model.eval()
            with torch.no_grad():
                for ex, _ in evaluation:
                    model(ex)
    report = read_report(tmp_path)
    assert report["steps"] == 6 and report["run"]["evaluations"] == 6


ATTACHED_WITHOUT_WITH = """
import os
import sys
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from perfhooks.integrations.accelerate import attach

accelerator = Accelerator(cpu=True, log_with=sys.argv[2] if len(sys.argv) > 2 else None, project_dir=sys.argv[1])
if len(sys.argv) > 2:
    accelerator.init_trackers("perfhooks-tests")
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(48, 8, generator=torch.Generator().manual_seed(0))
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(TensorDataset(x, x[:, :1]), batch_size=8))
perf = None if os.environ.get("LAUNCHED") else attach(accelerator, schedule=None)
for inputs, targets in loader:
    loss = nn.functional.mse_loss(model(inputs), targets)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    accelerator.log({"loss": loss.item()})
if len(sys.argv) > 2:
    accelerator.end_training()
print("done")
"""


def _run_script(tmp_path: Path, source: str, *args: str, env: dict[str, str] | None = None,
                launched: bool = False) -> Any:
    """``python script.py ARGS`` (or ``perfhooks run --schedule none script.py ARGS``)."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(source)
    launcher = ["-m", "perfhooks", "run", "--schedule", "none"] if launched else []
    return subprocess.run([sys.executable, *launcher, str(script), *args], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, **(env or {}), **({"LAUNCHED": "1"} if launched else {})})


def test_attach_without_with_prints_the_table_at_exit(tmp_path: Path) -> None:
    done = _run_script(tmp_path, ATTACHED_WITHOUT_WITH, str(tmp_path))
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "done", done.stderr[-2000:]
    assert "perfhooks: 6 steps" in done.stderr
    assert read_report(tmp_path / "perfhooks_out")["status"] == "completed"


@pytest.mark.parametrize("launched", [False, True], ids=["attach", "perfhooks_run"])
def test_end_training_closing_the_wandb_run_keeps_perfhooks_end_of_run_data(tmp_path: Path, launched: bool) -> None:
    """accelerator.end_training() finishes the W&B run: perfhooks flushes before it, so the report, the table
    and the summary reach W&B, and nothing is printed as a fault."""
    pytest.importorskip("wandb")
    from wandb_records import summary, wandb_records

    root = tmp_path / "wandb"
    root.mkdir()
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(root), "WANDB_CACHE_DIR": str(root / "c"),
           "WANDB_DATA_DIR": str(root / "d"), "WANDB_CONFIG_DIR": str(root / "cfg")}
    done = _run_script(tmp_path, ATTACHED_WITHOUT_WITH, str(tmp_path), "wandb", env=env, launched=launched)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "done", done.stderr[-2000:]
    assert "PerfhooksWarning" not in done.stderr, done.stderr
    report = read_report(tmp_path / "perfhooks_out")
    assert report["wandb"]["status"] != "failed", report["wandb"]
    assert summary(wandb_records(root))["perf/steps"] == 6


# ----------------------------------------------------------------------------- items 7-8: Lightning's counts
@pytest.mark.parametrize("raise_in", ["training_step", "own_callback_before", "own_callback_after"])
def test_a_failed_fit_counts_every_step_the_optimizer_took(tmp_path: Path, raise_in: str) -> None:
    """The step that stepped and then failed (in a callback's on_train_batch_end, before or after perfhooks'
    own) is counted, and the report's global_step is the trainer's."""
    import lightning as L

    from perfhooks.integrations.lightning import PerfCallback

    class Fails(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 3:
                raise RuntimeError("a callback failed")

    perf = PerfCallback(output_dir=tmp_path / "perf", console=False, schedule=None)
    failing = Fails()
    callbacks = {"training_step": [perf], "own_callback_before": [failing, perf],
                 "own_callback_after": [perf, failing]}[raise_in]
    model = lightning_mlp(fail_at_step=3 if raise_in == "training_step" else None)
    trainer = default_trainer(tmp_path, max_steps=8, callbacks=callbacks, enable_progress_bar=False)
    with pytest.raises(RuntimeError):
        trainer.fit(model, random_loader(8))
    report = read_report(tmp_path / "perf")
    assert report["status"] == "failed"
    assert (report["steps"], report["global_step"]) == (trainer.global_step, trainer.global_step)


def test_a_resumed_fit_that_takes_no_step_reports_the_trainers_global_step(tmp_path: Path) -> None:
    """A checkpoint written at the epoch's last batch (in on_train_batch_end, where Lightning's loop state is one
    step behind global_step) resumes into an epoch with no batch left: no step, and the trainer's global_step."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from perfhooks.integrations.lightning import PerfCallback

    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    first = default_trainer(tmp_path / "first", max_epochs=1, enable_progress_bar=False,
                            callbacks=[saver, PerfCallback(output_dir=tmp_path / "p1", console=False, schedule=None)])
    first.fit(lightning_mlp(), random_loader(4))
    resumed = default_trainer(tmp_path / "second", max_epochs=1, enable_progress_bar=False,
                              callbacks=[PerfCallback(output_dir=tmp_path / "p2", console=False, schedule=None)])
    resumed.fit(lightning_mlp(), random_loader(4), ckpt_path=saver.best_model_path or saver.last_model_path)
    report = read_report(tmp_path / "p2")
    assert (report["steps"], report["global_step"]) == (0, resumed.global_step) == (0, 4)


# ----------------------------------------------------------------------------- item 18: the whole save
def test_a_checkpoint_is_timed_as_the_callbacks_whole_save(tmp_path: Path) -> None:
    """Work ModelCheckpoint does around trainer.save_checkpoint (a subclass's _save_checkpoint override, the
    logger's after_save_checkpoint) is checkpoint time, and each save counts once."""
    import time

    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from perfhooks.integrations.lightning import PerfCallback

    class SlowCheckpoint(ModelCheckpoint):
        def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
            time.sleep(0.1)
            super()._save_checkpoint(trainer, filepath)

    class UploadingLogger(CSVLogger):
        def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
            time.sleep(0.1)

    saver = SlowCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = default_trainer(tmp_path, max_steps=8, enable_progress_bar=False, logger=UploadingLogger(tmp_path),
                              callbacks=[saver, PerfCallback(output_dir=tmp_path / "perf", console=False,
                                                             schedule=None)])
    trainer.fit(lightning_mlp(), random_loader(8))
    run = read_report(tmp_path / "perf")["run"]
    assert run["checkpoints"] == 4
    assert run["checkpointing_s"] >= 4 * 0.2  # both sleeps of each save, at least


# ----------------------------------------------------------------------------- item 13: quantiles
def _nearest_rank(values: list[float], q: float) -> float:
    import math

    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_phase_quantiles_are_the_exact_ones_of_a_real_run(tmp_path: Path) -> None:
    """The report's p50/p95 per phase against nearest-rank quantiles of the run's own per-step values (the series
    holds every step of this run): equal, and forward and backward never read one bucket's edge."""
    from perfhooks.integrations.lightning import PerfCallback

    trainer = default_trainer(tmp_path, max_steps=40, enable_progress_bar=False,
                              callbacks=[PerfCallback(output_dir=tmp_path / "perf", console=False, schedule=None)])
    trainer.fit(lightning_mlp(), random_loader(40))
    report = read_report(tmp_path / "perf")
    assert len(report["series"]["forward"]) == report["steps"] == 40
    for name in ("data_wait", "forward", "backward", "optimizer", "other"):
        values = report["series"][name]
        for q, key in ((0.5, "p50_ms"), (0.95, "p95_ms")):
            assert report["phases"][name][key] == pytest.approx(_nearest_rank(values, q), abs=1e-4), (name, key)


def test_streaming_quantiles_past_the_exact_limit_stay_within_one_percent() -> None:
    import random

    from perfhooks.report.statistics import EXACT_VALUES, StreamingStats

    generator = random.Random(0)
    first, second = StreamingStats(), StreamingStats()
    values_a = [generator.lognormvariate(3, 0.05) for _ in range(EXACT_VALUES + 500)]
    values_b = [v * 1.003 for v in values_a]  # the same bucket for most values, never the same value
    first.add_many(values_a)
    for value in values_b:
        second.add(value)
    for q in (0.5, 0.95, 0.99):
        for stats, values in ((first, values_a), (second, values_b)):
            assert stats.quantile(q) == pytest.approx(_nearest_rank(values, q), rel=0.01)
        assert first.quantile(q) != second.quantile(q)
    small = StreamingStats()
    small.add_many([3.0, 1.0, 2.0])
    assert (small.quantile(0.5), small.quantile(0.95)) == (2.0, 3.0)


# ----------------------------------------------------------------------------- item 19: window vs live
def test_a_window_verdict_the_runs_many_steps_contradict_is_dropped(tmp_path: Path) -> None:
    """A 3-step window's dataloader_bound over a run whose 30 steady steps wait for data 0% of the time: the
    larger evidence decides. With fewer live steps than the window's, the verdict says how few it saw."""
    from helpers import mlp, train_steps
    from perfhooks import Engine, PerfConfig
    from perfhooks.rules.verdicts import make
    from perfhooks.runtime.state.run_state import TraceVerdicts

    window_verdict = make("dataloader_bound", "warning", "Input pipeline holds the step back",
                          "DataLoader takes 30.0% of the step; threshold 10.0%", 0.3, "num_workers", step=5)
    for steps, kept in ((30, False), (2, True)):
        engine = Engine(PerfConfig(schedule=None, console=False), tmp_path / str(steps), framework="plain")
        model = mlp()
        batches = [torch.randn(64, 32) for _ in range(steps)]  # in memory: no wait for data
        train_steps(engine, lambda batch, model=model: model(batch).square().mean(),
                    torch.optim.SGD(model.parameters(), lr=0.1),
                    batches)
        assert "dataloader_bound" not in [d["id"] for d in engine.report()["diagnoses"]]
        engine.saving.trace = TraceVerdicts((window_verdict,), 3)
        found = [d for d in engine.report()["diagnoses"] if d["id"] == "dataloader_bound"]
        engine.close()
        assert bool(found) is kept
        if kept:
            assert "3-step window" in found[0]["evidence"]


def test_a_healthy_fit_with_a_window_never_reads_dataloader_bound(tmp_path: Path) -> None:
    """The healthy Lightning fit that carried dataloader_bound once in 6 repeats: 6 repeats, none does.

    Its batches are collated before the fit (``batch_size=None``): a fetch takes microseconds, where collating
    128 samples each step took about 1.2 ms of a 13 ms step (9%, a real wait a point under the threshold, which
    a loaded machine pushed over it: a verdict the data then supports).

    The premise, a healthy fit, is read from the median step: idle, Lightning's fetch path is about 0.12 ms of a
    5 ms step (2.4%). The mean share is not the premise: on a loaded machine one fetch descheduled for a few ms
    (seen: 4.2 ms) moves it (CI once read 5.7%), and the rule itself discounts such a stall."""
    from integrations.test_lightning import sized_module
    from torch.utils.data import DataLoader

    import perfhooks
    from helpers import sized_loader
    from perfhooks.integrations.lightning import PerfCallback

    batches = list(sized_loader(30))
    verdicts = []
    for repeat in range(6):
        out = tmp_path / str(repeat)
        callback = PerfCallback(output_dir=out / "perf", console=False,
                                schedule=perfhooks.Schedule(skip_first=10, warmup=1, active=3))
        trainer = default_trainer(out, max_steps=30, enable_progress_bar=False, callbacks=[callback])
        trainer.fit(sized_module(), DataLoader(batches, batch_size=None))
        report = read_report(out / "perf")
        assert len(report["windows"]) == 1
        verdicts.append([d["id"] for d in report["diagnoses"]])
        typical = report["phases"]["data_wait"]["p50_ms"] / report["steady"]["step_ms"]["p50"]
        assert typical < 0.05, report["phases"]["data_wait"]  # healthy by a wide margin
    assert not any("dataloader_bound" in ids for ids in verdicts), verdicts


def test_one_stalled_fetch_is_not_a_dataloader_bound_run() -> None:
    """30 steps of 10 ms with 0.1 ms of data wait, one of which waited 250 ms (a GC pause, a loaded machine):
    silent. The same wait spread over every step is a pattern: it fires."""
    from perfhooks.report.statistics import PhaseStatistics, StepTiming
    from perfhooks.rules.live import diagnose_live

    def run(waits: list[float]) -> list[str]:
        stats = PhaseStatistics()
        for step, wait in enumerate(waits):
            stats.add(StepTiming(step=step, step_ms=10.0 + wait, micro_batches=1, fetch_ms=wait,
                                 phase_ms={"data_wait": wait, "forward": 4.0, "backward": 5.0, "optimizer": 1.0}))
        return [d["id"] for d in diagnose_live(stats)]

    assert "dataloader_bound" not in run([0.1] * 17 + [250.0] + [0.1] * 12)
    assert "dataloader_bound" in run([250.0 / 30 + 0.1] * 30)


# ----------------------------------------------------------------------------- item 14: top operators
def test_top_operators_never_count_a_parent_with_its_child(tmp_path: Path) -> None:
    """A real CPU trace of attention on SDPA's math path (dropout on): aten::scaled_dot_product_attention and its
    own child aten::_scaled_dot_product_attention_math are ranked by self time, so the rows' times add up to no
    more than the steps' host time, and the parent's row is not its child's."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from perfhooks.analysis.operators import top_operators
    from perfhooks.analysis.trace import load_trace
    from perfhooks.offline.analyze import analyze_trace

    q = torch.randn(4, 4, 64, 32)
    path = tmp_path / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as profiler:
        for _ in range(4):
            with record_function("forward"):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1).sum()
            profiler.step()
    trace = load_trace(path)
    rows = top_operators(trace, top=1000)
    names = [row["name"] for row in rows]
    assert {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math"} <= set(names)
    parent = rows[names.index("aten::scaled_dot_product_attention")]
    child = rows[names.index("aten::_scaled_dot_product_attention_math")]
    # the parent's time excludes its child's; the inclusive host_us still says what it holds
    assert parent["time_us"] <= parent["host_us"] - child["host_us"] + 0.01
    assert child["time_us"] <= child["host_us"]
    in_steps = analyze_trace(trace)["metrics"]
    assert sum(row["share"] for row in _shares(in_steps)) <= 1.0 + 1e-6


def _shares(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    from perfhooks.capture.window_job import top_work

    return top_work(metrics, top=1000)["top_operators"]


# ----------------------------------------------------------------------------- item 12: unfused_attention
def _attention_trace(tmp_path: Path, name: str, dropout_p: float, dtype: torch.dtype = torch.float32) -> Any:
    """A real CPU trace of a few training steps whose attention is SDPA (and little else)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from perfhooks.analysis.trace import load_trace

    q = torch.randn(8, 4, 128, 64, dtype=dtype, requires_grad=True)
    path = tmp_path / f"{name}.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as profiler:
        for _ in range(4):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=dropout_p, is_causal=True).sum()
            profiler.step()
    return load_trace(path)


def test_sdpa_on_its_math_path_names_the_condition_and_a_fix_that_applies(tmp_path: Path) -> None:
    """GPT-2/BERT on CPU with attention dropout 0.1: SDPA's math path. The verdict names SDPA and dropout, is
    information (nothing applies on CPU), and never tells the user to switch to the SDPA they already call."""
    from perfhooks.offline.analyze import analyze_trace

    result = analyze_trace(_attention_trace(tmp_path, "dropout", 0.1))
    assert result["metrics"]["sdpa_math"]["dropout_p"] == pytest.approx(0.1)
    [verdict] = [d for d in result["diagnoses"] if d["id"] == "unfused_attention"]
    assert verdict["severity"] == "info" and "dropout_p=0.1" in verdict["evidence"]
    assert "scaled_dot_product_attention ran its math path" in verdict["evidence"]
    assert "attn_implementation" not in verdict["recommendation"]
    fused = analyze_trace(_attention_trace(tmp_path, "no_dropout", 0.0))  # the fused CPU kernel: no verdict
    assert fused["metrics"]["attention"].get("flash", 0) > 0
    assert "unfused_attention" not in [d["id"] for d in fused["diagnoses"]]


def test_sdpa_math_on_a_gpu_with_fp32_inputs_recommends_bf16() -> None:
    from perfhooks.rules.trace import diagnose_trace

    metrics = {"steps": 1, "step_us": 1000.0, "breakdown": {}, "devices": {"0": {}},
               "attention": {"math": 500.0}, "sdpa_math": {"calls": 12, "dropout_p": 0.1, "dtypes": ["float"],
                                                           "head_dims": [64], "head_dims_differ": False,
                                                           "masked": 0, "causal": 12}}
    [verdict] = [d for d in diagnose_trace(metrics) if d["id"] == "unfused_attention"]
    assert verdict["severity"] == "warning" and "fp16/bf16" in verdict["evidence"]
    assert "torch.autocast" in verdict["recommendation"] and "dropout" not in verdict["evidence"]


# ----------------------------------------------------------------------------- items 16-17: short and fast runs
def test_a_short_runs_window_is_analysed_without_starting_a_python(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """20 steps of Lightning's BoringModel with the default schedule: the window's small trace is analysed in the
    process (a few ms), not by a child interpreter (about 0.2 s to start, paid at the close of every short run
    and in the steps a fast run overlaps). `benchmarks/suite.py --only short_runs` measures both."""
    import subprocess

    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    from perfhooks.capture import window_job
    from perfhooks.integrations.lightning import PerfCallback

    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a child process was started for a small window")

    monkeypatch.setattr(window_job.subprocess, "run", no_child)
    assert window_job.subprocess is subprocess
    trainer = L.Trainer(max_steps=20, accelerator="cpu", devices=1, default_root_dir=str(tmp_path),
                        enable_progress_bar=False, callbacks=[PerfCallback(console=False)])
    trainer.fit(BoringModel())
    report = read_report(Path(trainer.log_dir) / "perfhooks")
    assert report["faults"] == [] and len(report["windows"]) == 1
    assert report["windows"][0]["metrics"]["top_operators"]  # analysed
