"""The Lightning adapter, exercised with real ``Trainer.fit`` runs on CPU."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from helpers import (
    annotation_names,
    default_trainer,
    lightning_mlp,
    load_trace,
    longest_step_after_the_first_ms,
    quiet_trainer,
    random_loader,
    read_report,
)
from perfhooks import PerfhooksWarning, Schedule
from perfhooks.integrations.lightning import PerfCallback
from perfhooks.report.schema import validate_report

REPO = Path(__file__).resolve().parents[2]


def fit(tmp_path: Path, steps: int, callback: PerfCallback | None = None, model=None, batches: int | None = None,
        **trainer_settings) -> PerfCallback:
    callback = callback or PerfCallback(output_dir=tmp_path, schedule=None, console=False)
    trainer = quiet_trainer(max_steps=steps, callbacks=[callback], **trainer_settings)
    trainer.fit(model or lightning_mlp(), random_loader(batches or steps * 4))
    return callback


def test_fit_times_every_step_and_writes_a_valid_report(tmp_path: Path) -> None:
    from helpers import sized_loader

    callback = PerfCallback(output_dir=tmp_path, console=False,
                            schedule=Schedule(skip_first=2, wait=0, warmup=1, active=2, repeat=1))
    quiet_trainer(max_steps=8, callbacks=[callback]).fit(sized_module(), sized_loader(8))
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
    from helpers import sized_loader

    callback = PerfCallback(output_dir=tmp_path, schedule=None, console=False)
    trainer = quiet_trainer(max_steps=3, callbacks=[callback], accumulate_grad_batches=accumulate)
    trainer.fit(sized_module(), sized_loader(3 * accumulate))
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
        time.sleep(0.1)

    model.validation_step = slow_validation_step
    callback = PerfCallback(output_dir=tmp_path, schedule=None, console=False)
    trainer = quiet_trainer(max_steps=6, callbacks=[callback], val_check_interval=2, num_sanity_val_steps=0)
    trainer.fit(model, random_loader(24), random_loader(4))
    report = read_report(tmp_path)
    assert report["steps"] == 6
    run = report["run"]
    one_evaluation_ms = 1e3 * run["evaluation_s"] / run["evaluations"]
    assert one_evaluation_ms >= 400  # four 100 ms batches
    # A step that held an evaluation would last at least as long as it: compared within this run
    assert longest_step_after_the_first_ms(report) < one_evaluation_ms / 2, "an evaluation ran inside a step"


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
    from perfhooks.runtime import engine as engine_module

    def broken_room(device):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(engine_module, "DeviceRoom", broken_room)
    model = lightning_mlp()
    with pytest.warns(PerfhooksWarning, match="engine_start failed .*injected fault"):
        callback = fit(tmp_path, steps=3, model=model)
    assert not callback.engine.active
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
    trainer = default_trainer(tmp_path, max_steps=2, callbacks=[callback], enable_progress_bar=False)
    trainer.fit(lightning_mlp(), random_loader(8))
    assert (Path(trainer.log_dir) / "perfhooks" / "report.json").exists()


def test_without_a_logger_the_output_dir_is_not_named_like_the_package(tmp_path: Path) -> None:
    """Without a logger, log_dir is default_root_dir (the working folder by default): a folder named perfhooks
    there would be imported in place of the package by the next run (issue 67)."""
    callback = PerfCallback(schedule=None, console=False)
    trainer = quiet_trainer(max_steps=2, callbacks=[callback], default_root_dir=tmp_path)
    trainer.fit(lightning_mlp(), random_loader(8))
    assert trainer.log_dir == str(tmp_path)
    assert (tmp_path / "perfhooks_out" / "report.json").exists() and not (tmp_path / "perfhooks").exists()


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
    assert ours == one_step * 3  # max_steps reached: no fourth fetch


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
    code = ("import sys, perfhooks, perfhooks.runtime.engine, perfhooks.report.write, perfhooks.capture.windows; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate', 'wandb') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_torch_cuda_is_not_touched_on_cpu(tmp_path: Path) -> None:
    fit(tmp_path, steps=2)
    assert not torch.cuda.is_initialized()


# ------------------------------------------------------------------ fidelity with Lightning's defaults on
def sized_module(save_sleep_s: float = 0.0, val_sleep_s: float = 0.0):
    """A LightningModule with steps of a few ms, a slow checkpoint hook and a slow validation step."""
    import lightning as L

    from helpers import sized_mlp

    class Sized(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = sized_mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            time.sleep(val_sleep_s)
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def on_save_checkpoint(self, checkpoint):
            time.sleep(save_sleep_s)  # a slow filesystem

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    return Sized()


def test_checkpoint_saves_are_checkpointing_not_data_wait(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from helpers import default_trainer, sized_loader

    callback = PerfCallback(output_dir=tmp_path / "perf", console=False, schedule=None)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=10)
    trainer = default_trainer(tmp_path, max_steps=30, callbacks=[callback, checkpoints], log_every_n_steps=5)
    start = time.perf_counter()
    # saves of 0.6 s each (a slow filesystem)
    trainer.fit(sized_module(save_sleep_s=0.6), sized_loader(40))
    wall_s = time.perf_counter() - start
    report = read_report(tmp_path / "perf")

    assert report["steps"] == 30 and report["global_step"] == trainer.global_step == 30
    # The three saves sleep 0.6 s each. The run account partitions the wall time (training, evaluation,
    # checkpointing, other): a save counted in a step or as data wait would leave checkpointing short of the
    # sleeps, and one counted twice would make the parts exceed the wall time. No timing bound, so no flake.
    run = report["run"]
    assert run["checkpoints"] == 3 and run["checkpointing_s"] >= 3 * 0.6
    parts = run["training_s"] + run["evaluation_s"] + run["checkpointing_s"] + run["other_s"]
    assert parts == pytest.approx(run["wall_s"], rel=0.01)
    assert run["wall_s"] <= wall_s
    ids = [d["id"] for d in report["diagnoses"]]
    # the verdict follows the run's own share (a loaded machine stretches the steps and lowers it)
    from perfhooks.rules.thresholds import Thresholds

    assert ("checkpoint_heavy" in ids) == (run["checkpointing_s"] / run["wall_s"] >= Thresholds().checkpoint_share)
    assert "dataloader_bound" not in ids
    assert "compile_warmup" not in ids, "nothing was compiled"


def test_validation_inside_a_window_is_outside_every_profiler_step(tmp_path: Path) -> None:
    from helpers import default_trainer, load_trace, overlaps, sized_loader, trace_spans

    callback = PerfCallback(output_dir=tmp_path / "perf", console=False, analyze_windows=False,
                            schedule=Schedule(skip_first=8, warmup=1, active=4))
    trainer = default_trainer(tmp_path, max_steps=16, callbacks=[callback], val_check_interval=10,
                              limit_val_batches=4, log_every_n_steps=5)  # the sanity check stays on
    # batches of 0.5 s: a profiled step preempted on a machine whose cores are taken (two pytest workers beside two
    # spinning processes) took 716 ms, more than half of four 0.1 s batches
    trainer.fit(sized_module(val_sleep_s=0.5), sized_loader(32), sized_loader(4))
    report = read_report(tmp_path / "perf")

    assert report["steps"] == 16
    assert report["run"]["evaluations"] == 1  # after batch 10 (max_steps ends the fit before the epoch ends)
    window = report["windows"][0]
    trace = load_trace(Path(window["path"]))
    steps = trace_spans(trace, "ProfilerStep#")
    evaluation = trace_spans(trace, "evaluation")
    assert len(steps) == 4 and len(evaluation) == 1
    assert not any(overlaps(step, evaluation[0]) for step in steps)
    evaluation_ms = (evaluation[0][1] - evaluation[0][0]) / 1e3
    assert evaluation_ms >= 2000  # four 500 ms batches
    longest_ms = max(end - start for start, end in steps) / 1e3
    assert longest_ms < evaluation_ms / 2, f"a ProfilerStep of {longest_ms:.0f} ms holds the evaluation"
    assert report["steady"]["step_ms"]["max"] < evaluation_ms / 2  # the window's own steps are marked apart


def gan_module():
    """A GAN in Lightning's manual optimization: two optimizers, two forwards per batch."""
    import lightning as L

    from helpers import sized_mlp

    class Gan(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.generator = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
            self.discriminator = sized_mlp()

        def training_step(self, batch, batch_idx):
            real, _ = batch
            g_opt, d_opt = self.optimizers()
            fake = self.generator(torch.randn(real.shape[0], 64))
            g_loss = torch.nn.functional.softplus(-self.discriminator(fake)).mean()
            g_opt.zero_grad()
            self.manual_backward(g_loss)
            g_opt.step()
            d_loss = (torch.nn.functional.softplus(-self.discriminator(real))
                      + torch.nn.functional.softplus(self.discriminator(fake.detach()))).mean()
            d_opt.zero_grad()
            self.manual_backward(d_loss)
            d_opt.step()
            self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

        def configure_optimizers(self):
            return (torch.optim.Adam(self.generator.parameters(), lr=2e-4),
                    torch.optim.Adam(self.discriminator.parameters(), lr=2e-4))

    return Gan()


def test_gan_with_two_optimizers_counts_batches_and_keeps_lightnings_step(tmp_path: Path) -> None:
    from helpers import default_trainer, sized_loader

    callback = PerfCallback(output_dir=tmp_path / "perf", console=False, schedule=None)
    trainer = default_trainer(tmp_path, max_steps=40, callbacks=[callback], log_every_n_steps=5)
    gan = gan_module()
    # the phase open at each of the discriminator's three forwards per batch: the two after the generator's
    # optimizer step must be forward too, not the optimizer's
    seen: list[str | None] = []
    gan.discriminator.register_forward_pre_hook(lambda module, args: seen.append(callback.engine.open_phase))
    trainer.fit(gan, sized_loader(40))
    report = read_report(tmp_path / "perf")

    assert trainer.global_step == 40  # Lightning counts each optimizer's step
    assert report["steps"] == 20 and report["global_step"] == 40
    assert report["series"]["global_step"][:3] == [2, 4, 6]
    assert report["coverage"] >= 0.95
    # the attribution itself, not a comparison of times: with both cores busy the p50s of these 20 steps once
    # read 152 ms forward and 180 ms optimizer (about 10 ms each when idle)
    assert len(seen) == 3 * 20 and set(seen) == {"forward"}, seen


def test_the_fetch_falls_back_to_the_profilers_action_where_the_loop_has_no_fetch_hook(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from lightning.pytorch.profilers import SimpleProfiler

    from perfhooks import Engine, PerfConfig

    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "lightning")
    profiler = SimpleProfiler()
    callback = PerfCallback(output_dir=tmp_path)
    callback._wrap_fetch(SimpleNamespace(profiler=profiler), engine)  # a Lightning with no _on_before_fetch
    profiler.start("[Callback]Other.on_train_batch_start")
    profiler.stop("[Callback]Other.on_train_batch_start")
    assert engine.tracker.record is None
    profiler.start("[_TrainingEpochLoop].train_dataloader_next")
    profiler.stop("[_TrainingEpochLoop].train_dataloader_next")
    assert engine.open_phase == "data_wait"
    assert "[_TrainingEpochLoop].train_dataloader_next" in profiler.recorded_durations, "the profiler still sees it"
    callback._unwrap()
    assert "start" not in profiler.__dict__
    engine.close()


def test_a_slow_callback_is_named_as_what_holds_the_step_back(tmp_path: Path) -> None:
    """Issue 29, item 10: a slow callback made `other` a quarter of the step and no diagnosis named it. With
    Lightning's defaults on (logger, checkpoint, progress bar, summary), the callback's own hook is named."""
    import lightning as L

    class SlowLogger(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            time.sleep(0.02)

    out = tmp_path / "perf"
    trainer = default_trainer(tmp_path, max_steps=30, callbacks=[PerfCallback(output_dir=out, schedule=None,
                                                                             console=False), SlowLogger()])
    trainer.fit(lightning_mlp(), random_loader(30))
    report = read_report(out)
    named = report["named_work_ms"]
    assert named["SlowLogger.on_train_batch_end"] >= 20.0  # 30 sleeps of at least 20 ms over 30 steps
    assert not any(name.startswith("PerfCallback") for name in named)  # perfhooks' own hooks are not the user's
    assert "ModelCheckpoint.on_train_batch_end" in named  # a state key's settings are not part of the name
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "other_heavy"]
    assert "SlowLogger.on_train_batch_end 2" in verdict["evidence"]
    assert verdict["recommendation"].startswith("Make SlowLogger cheaper")
    assert verdict["measured"]["other_share"] >= 0.15


def test_callback_hooks_are_timed_in_the_first_steps_then_one_in_16(tmp_path: Path) -> None:
    """Lightning reports about 48 profiler actions a step. perfhooks times the callback hooks among them in the
    first 32 steps, then in one detailed step in 16 (every step is detailed here: no budget); between those the
    profiler's own methods are back, and after the fit the profiler holds exactly what it held before. The named
    work is per timed step."""
    import lightning as L

    class SlowLogger(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            time.sleep(0.005)

    timed: list[bool] = []

    class Probe(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            timed.append("start" in vars(trainer.profiler))

    out = tmp_path / "perf"
    trainer = default_trainer(tmp_path, max_steps=80, callbacks=[
        PerfCallback(output_dir=out, schedule=None, console=False, overhead_budget=None), SlowLogger(), Probe()])
    trainer.fit(lightning_mlp(), random_loader(80))
    assert timed[:32] == [True] * 32
    assert [step for step, on in enumerate(timed) if on and step >= 32] == [32, 48, 64]
    assert "start" not in vars(trainer.profiler) and "stop" not in vars(trainer.profiler)
    report = read_report(out)
    assert report["steps"] == 80
    # 35 timed steps of 5 ms or more: over all 80 steps it would read about 2.2 ms
    assert report["named_work_ms"]["SlowLogger.on_train_batch_end"] >= 5.0, report["named_work_ms"]


def test_callback_timing_puts_back_what_the_profiler_held_at_each_switch() -> None:
    """A user's own ``start`` on the profiler instance is put back at each switch off; one set while timing was
    off is the one put back after the next switch; a user's replacement while timing is on stays theirs."""
    from lightning.pytorch.profilers import PassThroughProfiler

    from perfhooks.integrations.lightning import CallbackTiming

    profiler = PassThroughProfiler()
    users_start = lambda action_name: None  # noqa: E731
    profiler.start = users_start
    began: dict[str, int] = {"[Callback]X.on_train_batch_end": 1}
    timing = CallbackTiming(profiler, lambda name: None, lambda name: None, began)
    timing.on()
    timing.on()  # a second switch on changes nothing
    assert vars(profiler)["start"].func is timing.wrappers["start"] and not began  # inside a pickling Patched
    timing.off()
    assert vars(profiler)["start"] is users_start and "stop" not in vars(profiler)
    later = lambda action_name: None  # noqa: E731
    profiler.start = later
    timing.on()
    timing.off()
    assert vars(profiler)["start"] is later
    timing.on()
    replaced = lambda action_name: None  # noqa: E731
    profiler.stop = replaced  # the user's, while timing is on
    timing.off()
    assert vars(profiler)["stop"] is replaced and vars(profiler)["start"] is later


def test_light_steps_with_lightnings_defaults_on(tmp_path: Path) -> None:
    """Past the sampler's warm-up, under a budget that affords only the floor's detailed steps: with Lightning's
    logger, checkpointing, progress bar and a validation every 40 steps on, every training step counts, the
    phases come from the detailed ones, validation stays out of the steps, and the fit writes what it writes
    without perfhooks (its metrics file and checkpoint)."""
    from perfhooks.runtime.step.sampling import WARMUP_STEPS

    steps = WARMUP_STEPS + 70
    callback = PerfCallback(schedule=None, console=False, overhead_budget=1e-9)
    trainer = default_trainer(tmp_path, max_steps=steps, callbacks=[callback], val_check_interval=40,
                              limit_val_batches=2)
    trainer.fit(lightning_mlp(), random_loader(steps), random_loader(4))
    report = read_report(Path(trainer.log_dir) / "perfhooks")
    overhead = report["overhead"]
    assert report["status"] == "completed" and report["steps"] == steps == trainer.global_step
    assert overhead["detailed_steps"] + overhead["light_steps"] + overhead["dark_steps"] == steps
    assert overhead["light_steps"] > 0
    assert report["phase_steps"] == overhead["detailed_steps"] < WARMUP_STEPS + 15
    assert report["run"]["evaluations"] == 3  # at steps 40, 80 and 120: asides, not steps
    assert (Path(trainer.log_dir) / "metrics.csv").exists()
    assert list((Path(trainer.log_dir) / "checkpoints").glob("*.ckpt"))
