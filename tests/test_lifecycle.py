"""One lifecycle, closed exactly once on every path, and the user's program left as it would be without perfhooks:
caught and retried runs, return values, copies, checkpoints, sweeps, errors after the end, the exit order."""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from helpers import default_trainer, lightning_mlp, quiet_trainer, random_loader, read_report
from perfhooks import Engine, PerfConfig, Schedule

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "scripts" / "caught_and_retried.py"


def run_script(mode: str, perf: bool, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), mode, "1" if perf else "0", str(out)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "0"})


def program_lines(stdout: str) -> list[str]:
    """The program's own lines (the Trainer's printed log dicts carry perf/* by design: they are a report_to sink)."""
    return [line for line in stdout.splitlines() if not line.startswith("{")]


def last_stderr_line(stderr: str) -> str:
    """torch 2.13's CPU build prints two ``USDT:`` lines for every torch.profiler session, perfhooks' or not."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("USDT:")][-1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["caught_oom", "auto_find", "uncaught"])
def test_caught_retried_and_uncaught_runs_leave_the_program_as_it_is(mode: str, tmp_path: Path) -> None:
    without = run_script(mode, False, tmp_path / "without")
    with_perf = run_script(mode, True, tmp_path / "with")
    assert with_perf.returncode == without.returncode == (1 if mode == "uncaught" else 0), with_perf.stderr[-2000:]
    assert program_lines(with_perf.stdout) == program_lines(without.stdout)
    report = json.loads((tmp_path / "with" / "_perfhooks" / "report.json").read_text())
    if mode == "uncaught":  # a failing program: its last stderr line is its error, as without perfhooks
        assert last_stderr_line(with_perf.stderr) == last_stderr_line(without.stderr) == \
            "ValueError: the user's own bug"
        assert report["status"] == "failed" and report["error"]["type"] == "ValueError"
        traceback_at = with_perf.stderr.index("Traceback")
        assert "perfhooks:" not in with_perf.stderr[traceback_at:], "nothing of perfhooks' after the traceback"
        return
    # the newest run's report is on disk after exit: the abandoned attempt's late close did not replace it
    assert report["status"] == "completed" and report["steps"] == 12
    summary = json.loads((tmp_path / "with" / "_perfhooks" / "oom" / "summary.json").read_text())
    assert summary["error_type"] == "RuntimeError" and summary["requested_bytes"] == 2**60


def hf_trainer(out: Path, perf: bool, **args: Any) -> Any:
    from hf_trainer_example import SyntheticTokens, build_trainer
    from perfhooks.integrations.transformers import PerfTrainerCallback

    callback = PerfTrainerCallback(schedule=None, console=False) if perf else None
    trainer = build_trainer(str(out), steps=8, batch_size=4, callback=callback, eval_dataset=SyntheticTokens(8),
                            logging_steps=2, disable_tqdm=False, **args)  # the Trainer's own progress bar
    if not perf:
        trainer.callback_handler.callbacks = [c for c in trainer.callback_handler.callbacks
                                              if type(c).__name__ != "PerfTrainerCallback"]
    return trainer


def test_train_and_evaluate_return_what_they_return_without_perfhooks(tmp_path: Path) -> None:
    results = {}
    for perf in (False, True):
        torch.manual_seed(0)
        trainer = hf_trainer(tmp_path / str(perf), perf)
        train = trainer.train()
        results[perf] = (train.global_step, train.training_loss, sorted(train.metrics),
                         trainer.evaluate(), [sorted(entry) for entry in trainer.state.log_history])
    timeless = [{k: v for k, v in r[3].items() if "runtime" not in k and "per_second" not in k}
                for r in results.values()]
    assert timeless[0] == timeless[1]
    assert results[False][:3] == results[True][:3]
    assert results[False][4] == results[True][4], "log_history (saved in every checkpoint) is unchanged"


def test_hyperparameter_search_chooses_the_same_trial(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    from hf_trainer_example import tiny_gpt2

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = {}
    for perf in (False, True):
        trainer = hf_trainer(tmp_path / str(perf), perf, eval_strategy="steps", eval_steps=4)
        trainer.model_init = lambda trial=None: tiny_gpt2()
        best = trainer.hyperparameter_search(
            direction="minimize", backend="optuna", n_trials=4, sampler=optuna.samplers.TPESampler(seed=0),
            hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-5, 1e-2, log=True)})
        chosen[perf] = (best.run_id, best.hyperparameters)
        del trainer  # something of Optuna's keeps this frame alive: let the trainers go with the test
    assert chosen[True] == chosen[False]


def test_the_default_folder_is_not_uploaded_by_push_to_hub(tmp_path: Path) -> None:
    from huggingface_hub.utils import filter_repo_objects

    trainer = hf_trainer(tmp_path, True)
    trainer.train()
    trainer.save_model()
    files = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()]
    assert any(f.startswith("_perfhooks/") for f in files)
    # the patterns Trainer.push_to_hub passes to upload_folder
    uploaded = list(filter_repo_objects(files, ignore_patterns=["_*", "checkpoint-*"]))
    assert uploaded and not [f for f in uploaded if "perfhooks" in f or f.endswith(".pt.trace.json.gz")]


# ------------------------------------------------------------------ copies and checkpoints
class PicklableRegression(L.LightningModule):
    """A module-level LightningModule: ``torch.save(trainer)`` pickles the model too."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(32, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_every_integration_object_pickles_and_deep_copies(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from perfhooks.integrations.accelerate import attach
    from perfhooks.integrations.lightning import PerfCallback
    from perfhooks.integrations.transformers import PerfTrainerCallback

    copied = []

    def copies(obj: Any) -> None:
        copied.append(type(pickle.loads(pickle.dumps(obj))).__name__)
        copied.append(type(copy.deepcopy(obj)).__name__)

    class CopyDuringFit(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                copies(trainer.callbacks[0])
                copy.deepcopy(trainer.callbacks)

    perf = PerfCallback(output_dir=tmp_path / "l", console=False, schedule=Schedule(skip_first=1, active=2))
    copies(perf)
    trainer = default_trainer(tmp_path, max_steps=4, callbacks=[perf, CopyDuringFit()])
    trainer.fit(PicklableRegression(), random_loader(8))
    copies(perf)
    trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, CopyDuringFit)]  # a local class
    torch.save(trainer, tmp_path / "trainer.pt")  # what two of Lightning's own tests do
    restored = pickle.loads(pickle.dumps(perf))
    assert not restored.engine.active and restored.config.schedule == perf.config.schedule

    hf = PerfTrainerCallback(schedule=None, console=False)
    copies(hf)
    hf_run = hf_trainer(tmp_path / "hf", False)
    hf_run.add_callback(hf)
    hf_run.train()
    copies(hf)

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, _loader = accelerator.prepare(model, optimizer, random_loader(4))
    session = attach(accelerator, output_dir=tmp_path / "a", schedule=None, console=False)
    copies(session)
    session.close()
    copies(session)
    assert copied.count("PerfCallback") == 6 and copied.count("PerfTrainerCallback") == 4
    assert copied.count("PerfSession") == 4


def test_a_checkpoint_loads_without_perfhooks_and_a_resume_keeps_the_schedule(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from perfhooks.integrations.lightning import PerfCallback

    perf = PerfCallback(output_dir=tmp_path / "a", console=False, schedule=None)
    default_trainer(tmp_path / "a", max_steps=4, callbacks=[perf, ModelCheckpoint(dirpath=tmp_path / "ckpt")]
                    ).fit(lightning_mlp(), random_loader(8))
    checkpoint = next((tmp_path / "ckpt").glob("*.ckpt"))
    assert "PerfCallback" not in torch.load(checkpoint, weights_only=False).get("callbacks", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(max_steps=6).fit(lightning_mlp(), random_loader(8), ckpt_path=checkpoint)
    assert [str(w.message) for w in caught if "PerfCallback" in str(w.message)] == []
    resumed = PerfCallback(output_dir=tmp_path / "b", console=False, schedule=Schedule(skip_first=5, warmup=0,
                                                                                        active=1))
    quiet_trainer(max_steps=8, callbacks=[resumed]).fit(lightning_mlp(), random_loader(16), ckpt_path=checkpoint)
    report = read_report(tmp_path / "b")
    assert report["steps"] == 4 and [w["first_step"] for w in report["windows"]] == [5]
    # the same callback in a new fit without a checkpoint starts from 0
    quiet_trainer(max_steps=6, callbacks=[resumed]).fit(lightning_mlp(), random_loader(8))
    assert resumed.engine.step == 6 and [w["first_step"] for w in read_report(tmp_path / "b")["windows"]] == [5]


# ------------------------------------------------------------------ sweeps, late errors, signals
def test_ten_fits_in_one_process_keep_no_model_alive(tmp_path: Path) -> None:
    from perfhooks.integrations.lightning import PerfCallback

    alive = []
    callbacks = []
    for index in range(10):
        model = lightning_mlp()
        alive.append(weakref.ref(model))
        callback = PerfCallback(output_dir=tmp_path / str(index), console=False,
                                schedule=Schedule(skip_first=1, warmup=0, active=1))
        callbacks.append(callback)  # the user keeps the callbacks; they must not keep the models
        trainer = default_trainer(tmp_path / str(index), max_steps=3, callbacks=[callback])
        trainer.fit(model, random_loader(4))
        del model, trainer
    gc.collect()
    assert [ref() is None for ref in alive] == [True] * 10
    assert all(read_report(tmp_path / str(i))["status"] == "completed" for i in range(10))


def test_an_error_after_on_train_end_is_still_a_failure(tmp_path: Path) -> None:
    from perfhooks.integrations.lightning import PerfCallback

    class FailsAtTheEnd(L.Callback):
        def on_fit_end(self, trainer, pl_module):
            raise RuntimeError("the upload at the end failed")

    perf = PerfCallback(output_dir=tmp_path, console=False, schedule=None)
    with pytest.raises(RuntimeError, match="the upload at the end failed"):
        quiet_trainer(max_steps=3, callbacks=[perf, FailsAtTheEnd()]).fit(lightning_mlp(), random_loader(4))
    report = read_report(tmp_path)
    assert report["status"] == "failed" and report["steps"] == 3
    assert report["error"] == {"type": "RuntimeError", "message": "the upload at the end failed", "step": 3,
                               "phase": "after training"}


def test_an_accelerate_loop_left_by_a_caught_error_is_closed_at_the_next_attach(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from perfhooks.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, random_loader(8))
    first = attach(accelerator, output_dir=tmp_path / "first", console=False,
                   schedule=Schedule(skip_first=1, warmup=0, active=3))
    try:
        for step, (x, y) in enumerate(loader):
            if step == 2:
                raise ValueError("a bad batch")  # the user's own code, in the window
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
    except ValueError:
        pass
    assert not first.engine.closed
    second = attach(accelerator, output_dir=tmp_path / "second", console=False, schedule=None)
    assert first.engine.closed and not torch.autograd.profiler._is_profiler_enabled
    assert read_report(tmp_path / "first")["status"] == "completed"  # accelerate has no end event to miss
    second.close()


def test_the_signal_handler_is_restored_only_if_it_is_still_ours(tmp_path: Path) -> None:
    from perfhooks.capture.trigger import OnDemandTrigger

    def users(signum: int, frame: Any) -> None:
        pass

    original = signal.getsignal(signal.SIGUSR2)
    trigger = OnDemandTrigger(tmp_path)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert trigger.poll() is True and trigger.poll() is False
    signal.signal(signal.SIGUSR2, users)  # the user installs theirs during the run
    trigger.close()
    assert signal.getsignal(signal.SIGUSR2) is users
    signal.signal(signal.SIGUSR2, original)
    trigger = OnDemandTrigger(tmp_path)
    trigger.close()
    assert signal.getsignal(signal.SIGUSR2) == original


def test_a_sigusr2_handler_from_outside_python_is_left_in_place(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``signal.getsignal`` is None for a handler installed outside Python (an embedding program, a native
    library): perfhooks can neither chain to it nor put it back, so it does not take SIGUSR2 at all (before, it
    replaced the handler and left SIG_DFL at the close: the next SIGUSR2 killed the process)."""
    from perfhooks.capture.trigger import OnDemandTrigger

    installed: list[Any] = []
    monkeypatch.setattr(signal, "getsignal", lambda signum: None)  # what CPython says of such a handler
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.append(handler))
    trigger = OnDemandTrigger(tmp_path)
    trigger.close()
    assert installed == [] and "outside Python" in (trigger.signal_skipped or "")
    (tmp_path / "TRIGGER").touch()
    assert trigger.take() is True, "the trigger file still opens a window"


def test_a_sigusr2_ignored_before_the_run_is_ignored_after_it(tmp_path: Path) -> None:
    from perfhooks.capture.trigger import OnDemandTrigger

    original = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        trigger = OnDemandTrigger(tmp_path)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert trigger.poll() is True
        trigger.close()
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR2)  # ignored, as before perfhooks
    finally:
        signal.signal(signal.SIGUSR2, original)


# ------------------------------------------------------------------ which report wins
def test_an_older_runs_write_and_a_late_window_write_lose(tmp_path: Path) -> None:
    from perfhooks.report.write import write_merged_report, write_report

    def report(run_id: str, started_at: float, status: str, rank: int = 0, world: int = 1) -> dict[str, Any]:
        return {"run_id": run_id, "started_at": started_at, "status": status, "rank": rank, "world_size": world,
                "framework": "test", "device": {"type": "cpu"}, "steps": 1, "step_ms": {"mean": 1.0, "p95": 1.0},
                "phases": {}, "coverage": 1.0, "windows": [], "diagnoses": [], "faults": [], "series": {}}

    assert write_report(tmp_path, report("new", 200.0, "completed")) is not None
    assert write_report(tmp_path, report("old", 100.0, "failed")) is None, "an abandoned older run closing late"
    assert write_report(tmp_path, report("new", 200.0, "running")) is None, "a window-end write after the final one"
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "completed"
    assert write_report(tmp_path, report("newer", 300.0, "running")) is not None
    # multi-rank: the merged report waits for every rank's final report
    write_report(tmp_path, report("r0", 400.0, "completed", 0, 2))
    write_report(tmp_path, report("r1", 400.0, "running", 1, 2))
    assert write_merged_report(tmp_path, 2) is None


def test_the_exit_work_keeps_its_deadline_and_makes_no_cuda_call_after_a_cuda_error(tmp_path: Path) -> None:
    import time

    from perfhooks import Engine, PerfConfig

    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "test")
    engine.phase_start("forward")
    engine.writer.submit("stuck", lambda: time.sleep(30))  # a trace export on a stalled filesystem
    windows_closed = []
    engine.windows.close = lambda: windows_closed.append(True)  # would stop a CUDA profiler session
    start = time.monotonic()
    engine.exception(RuntimeError("CUDA error: an illegal memory access was encountered"), deadline_s=1.0)
    assert time.monotonic() - start < 10.0  # the 1 s deadline, not the 30 s export (10x apart either way)
    assert engine.cuda_broken and windows_closed == []
    assert engine.error["type"] == "RuntimeError"


def test_a_new_run_waits_a_bounded_time_for_the_one_it_abandons(tmp_path: Path) -> None:
    """A run left open (an error the caller caught) is abandoned when the next one starts. Its writer is stuck (a
    slow disk): the next run starts once the exit deadline has passed, not after the writer's own 60 s."""
    import threading

    from perfhooks.runtime.ending.exit_guard import EXIT_DEADLINE_S

    first = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path / "first", "test")
    stuck = threading.Event()
    first.writer.submit("slow disk", lambda: stuck.wait(120.0))
    started = threading.Event()

    def next_run() -> None:
        Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path / "second", "test").close()
        started.set()

    threading.Thread(target=next_run, daemon=True).start()
    try:
        assert started.wait(EXIT_DEADLINE_S + 30.0), "the next run waited on the abandoned run's writer"
        assert read_report(tmp_path / "first")["status"] == "completed", "its report written, on time"
    finally:
        stuck.set()
