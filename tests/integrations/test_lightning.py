"""The Lightning adapter, exercised with real ``Trainer.fit`` runs on CPU."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from helpers import annotation_names, lightning_mlp, load_trace, quiet_trainer, random_loader, read_report
from perfhooks import PerfhooksWarning, Schedule
from perfhooks.integrations.lightning import PerfCallback
from perfhooks.report import validate_report

REPO = Path(__file__).resolve().parents[2]


def fit(tmp_path: Path, steps: int, callback: PerfCallback | None = None, model=None, batches: int | None = None,
        **trainer_settings) -> PerfCallback:
    callback = callback or PerfCallback(output_dir=tmp_path, schedule=None, console=False)
    trainer = quiet_trainer(max_steps=steps, callbacks=[callback], **trainer_settings)
    trainer.fit(model or lightning_mlp(), random_loader(batches or steps * 4))
    return callback


def test_fit_times_every_step_and_writes_a_valid_report(tmp_path: Path) -> None:
    callback = PerfCallback(output_dir=tmp_path, console=False,
                            schedule=Schedule(skip_first=2, wait=0, warmup=1, active=2, repeat=1))
    fit(tmp_path, steps=8, callback=callback)
    report = read_report(tmp_path)
    assert validate_report(report) == []
    assert report["framework"] == "lightning" and report["status"] == "completed"
    assert report["steps"] == 8 and report["micro_batches"] == 8
    assert report["device"]["type"] == "cpu"
    for phase in ("data_wait", "forward", "backward", "optimizer"):
        assert report["phases"][phase]["mean_ms"] > 0, phase
    assert report["coverage"] >= 0.9
    assert [(w["first_step"], w["last_step"]) for w in report["windows"]] == [(3, 4)]
    names = annotation_names(load_trace(Path(report["windows"][0]["path"])))
    assert {"ProfilerStep#3", "ProfilerStep#4", "data_wait", "forward", "backward", "optimizer"} <= set(names)


@pytest.mark.parametrize("accumulate", [1, 4])
def test_gradient_accumulation_adds_micro_batches_not_steps(tmp_path: Path, accumulate: int) -> None:
    fit(tmp_path, steps=3, accumulate_grad_batches=accumulate)
    report = read_report(tmp_path)
    assert report["steps"] == 3
    assert report["micro_batches"] == 3 * accumulate
    assert report["coverage"] >= 0.9


def test_manual_optimization(tmp_path: Path) -> None:
    fit(tmp_path, steps=5, model=lightning_mlp(manual=True))
    report = read_report(tmp_path)
    assert report["steps"] == 5
    assert report["phases"]["optimizer"]["mean_ms"] > 0
    assert report["phases"]["backward"]["mean_ms"] > 0


def test_bf16_mixed_precision(tmp_path: Path) -> None:
    fit(tmp_path, steps=4, precision="bf16-mixed")
    assert read_report(tmp_path)["steps"] == 4


def test_validation_is_kept_out_of_training_steps(tmp_path: Path) -> None:
    model = lightning_mlp()

    def slow_validation_step(batch, batch_idx):
        time.sleep(0.05)

    model.validation_step = slow_validation_step
    callback = PerfCallback(output_dir=tmp_path, schedule=None, console=False)
    trainer = quiet_trainer(max_steps=6, callbacks=[callback], val_check_interval=2, num_sanity_val_steps=0)
    trainer.fit(model, random_loader(24), random_loader(4))
    report = read_report(tmp_path)
    assert report["steps"] == 6
    assert report["step_ms"]["max"] < 100, "four 50 ms validation batches ran between steps"


def test_resume_keeps_the_step_counter_and_the_schedule_aligned(tmp_path: Path) -> None:
    first = fit(tmp_path / "a", steps=4, enable_checkpointing=True, default_root_dir=tmp_path / "a")
    checkpoint = next((tmp_path / "a").rglob("*.ckpt"))
    assert first.engine.step == 4
    callback = PerfCallback(output_dir=tmp_path / "b", console=False,
                            schedule=Schedule(skip_first=5, wait=0, warmup=0, active=1, repeat=1))
    trainer = quiet_trainer(max_steps=8, callbacks=[callback])
    trainer.fit(lightning_mlp(), random_loader(32), ckpt_path=checkpoint)
    report = read_report(tmp_path / "b")
    assert callback.engine.step == 8
    assert report["steps"] == 4
    assert [w["first_step"] for w in report["windows"]] == [5]


class UserError(Exception):
    pass


def test_the_users_exception_propagates_unchanged(tmp_path: Path) -> None:
    original = UserError("the user's own bug")
    model = lightning_mlp()
    real_step = model.training_step

    def failing_step(batch, batch_idx):
        if model.global_step == 2:
            raise original
        return real_step(batch, batch_idx)

    model.training_step = failing_step
    with pytest.raises(UserError) as caught:
        fit(tmp_path, steps=6, model=model)
    assert caught.value is original
    report = read_report(tmp_path)
    assert report["status"] == "failed"
    assert report["error"]["type"] == "UserError" and report["error"]["step"] == 2
    assert report["steps"] == 2


def test_a_failing_engine_start_warns_and_training_completes(tmp_path: Path, monkeypatch) -> None:
    from perfhooks import engine as engine_module

    def broken_describe_device(device):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(engine_module, "describe_device", broken_describe_device)
    model = lightning_mlp()
    with pytest.warns(PerfhooksWarning, match="engine_start failed .*injected fault"):
        callback = fit(tmp_path, steps=3, model=model)
    assert callback.engine is None
    assert model.global_step == 3


def test_lightning_pytorch_profiler_alongside(tmp_path: Path) -> None:
    callback = PerfCallback(output_dir=tmp_path, console=False,
                            schedule=Schedule(skip_first=0, wait=0, warmup=0, active=2, repeat=0))
    with pytest.warns(PerfhooksWarning, match="another torch.profiler session") as caught:
        fit(tmp_path, steps=6, callback=callback, profiler="pytorch", default_root_dir=tmp_path / "lp")
    assert len([w for w in caught if "another torch.profiler" in str(w.message)]) == 1
    assert read_report(tmp_path)["steps"] == 6


def test_default_output_dir_is_under_the_trainer_log_dir(tmp_path: Path) -> None:
    callback = PerfCallback(schedule=None, console=False)
    trainer = quiet_trainer(max_steps=2, callbacks=[callback], default_root_dir=tmp_path)
    trainer.fit(lightning_mlp(), random_loader(8))
    assert (Path(trainer.log_dir) / "perfhooks" / "report.json").exists()


def test_console_table_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fit(tmp_path, steps=3, callback=PerfCallback(output_dir=tmp_path, schedule=None))
    err = capsys.readouterr().err
    assert "perfhooks: 3 steps" in err
    for phase in ("data_wait", "forward", "backward", "optimizer", "other"):
        assert f"  {phase} " in err


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"max_traces": 0}, ValueError, "max_traces must be an integer >= 1"),
    ({"schedule": "often"}, TypeError, "schedule must be a perfhooks.Schedule or None"),
    ({"max_trace": 2}, TypeError, r"unknown argument\(s\) max_trace"),
])
def test_bad_arguments_fail_at_construction(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PerfCallback(**kwargs)


NVTX_FIT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from helpers import lightning_mlp, quiet_trainer, random_loader
    from perfhooks.integrations.lightning import PerfCallback
    callback = PerfCallback(output_dir={out!r}, schedule=None, console=False)
    quiet_trainer(max_steps=3, callbacks=[callback]).fit(lightning_mlp(), random_loader(12))
""")


def test_nvtx_ranges_for_three_steps_in_exact_order(tmp_path: Path, nvtx_recorder: Path) -> None:
    log = tmp_path / "nvtx.log"
    script = NVTX_FIT.format(tests=str(REPO / "tests"), out=str(tmp_path / "out"))
    env = dict(os.environ, NVTX_INJECTION64_PATH=str(nvtx_recorder), PERFHOOKS_NVTX_LOG=str(log))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    events = [line.split("\t") for line in log.read_text().splitlines()]
    ours = [(kind, message) for kind, domain, message in events if domain == "perfhooks"]
    one_step = []
    for phase in ("data_wait", "forward", "backward", "optimizer"):
        one_step += [("push", phase), ("pop", "")]
    assert ours == one_step * 3 + [("push", "data_wait"), ("pop", "")]


def test_module_ranges_come_from_forward_hooks(tmp_path: Path, nvtx_recorder: Path) -> None:
    log = tmp_path / "nvtx.log"
    script = NVTX_FIT.format(tests=str(REPO / "tests"), out=str(tmp_path / "out")).replace(
        "console=False", "console=False, module_ranges=True").replace("max_steps=3", "max_steps=1")
    env = dict(os.environ, NVTX_INJECTION64_PATH=str(nvtx_recorder), PERFHOOKS_NVTX_LOG=str(log))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    pushed = [line.split("\t")[2] for line in log.read_text().splitlines() if line.startswith("push\tperfhooks")]
    # training_step calls self.net, so the LightningModule's own forward never runs
    assert pushed[:6] == ["data_wait", "forward", "net", "net.0", "net.1", "net.2"]


def test_core_imports_no_framework() -> None:
    code = ("import sys, perfhooks, perfhooks.engine, perfhooks.report, perfhooks.windows; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate', 'wandb') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_torch_cuda_is_not_touched_on_cpu(tmp_path: Path) -> None:
    fit(tmp_path, steps=2)
    assert not torch.cuda.is_initialized()
