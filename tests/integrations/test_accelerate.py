"""The accelerate adapter on a real Accelerator and a hand-written loop."""

from __future__ import annotations

import contextlib
import json
import statistics
import warnings
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from helpers import longest_step_after_the_first_ms, mlp, random_loader
from perfhooks import PerfhooksWarning, Schedule
from perfhooks.integrations.accelerate import attach


def prepared(batches: int = 8):
    accelerator = Accelerator(cpu=True)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer, data = accelerator.prepare(model, optimizer, random_loader(batches))
    return accelerator, model, optimizer, data


def train_epoch(accelerator, model, optimizer, data) -> int:
    batches = 0
    for x, y in data:
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        batches += 1
    return batches


def test_the_same_dataloader_object_is_used_and_restored(tmp_path: Path) -> None:
    accelerator, model, optimizer, data = prepared()
    original_type = type(data)
    backward = accelerator.backward
    session = attach(accelerator, model, optimizer, data, output_dir=tmp_path, schedule=None, console=False)
    assert isinstance(data, torch.utils.data.DataLoader), "isinstance still sees the wrapped DataLoader"
    assert train_epoch(accelerator, model, optimizer, data) == 8
    assert train_epoch(accelerator, model, optimizer, data) == 8, "a second epoch over the same object"
    report = session.close()
    assert report["steps"] == 16
    assert type(data) is original_type
    assert accelerator.backward == backward
    assert train_epoch(accelerator, model, optimizer, data) == 8, "still works after close"
    assert session.close() is None


def test_accelerator_profile_is_not_doubled(tmp_path: Path) -> None:
    accelerator, model, optimizer, data = prepared()
    with pytest.warns(PerfhooksWarning, match=r"accelerator.profile\(\)"), \
            attach(accelerator, model, optimizer, data, output_dir=tmp_path, console=False,
                   schedule=Schedule(skip_first=0, warmup=0, active=2, repeat=0)) as session, \
            accelerator.profile() as theirs:
        train_epoch(accelerator, model, optimizer, data)
    assert session.engine.report()["windows"] == []
    assert "forward" in {event.name for event in theirs.events()}


def test_an_error_in_the_loop_writes_a_failed_report_and_propagates(tmp_path: Path) -> None:
    accelerator, model, optimizer, data = prepared()
    error = RuntimeError("the user's loop broke")
    with pytest.raises(RuntimeError) as caught, \
            attach(accelerator, model, optimizer, data, output_dir=tmp_path, schedule=None, console=False):
        for step, (x, y) in enumerate(data):
            if step == 3:
                raise error
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    assert caught.value is error
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "failed" and report["error"]["type"] == "RuntimeError"
    assert report["steps"] == 3


def test_an_optimizer_step_that_raised_is_not_counted(tmp_path: Path) -> None:
    """The user's optimizer raises in its 4th step (a NaN check, say), the loop catches it and goes on: 7 steps
    were taken of 8 iterations (before, the one that raised counted too)."""
    accelerator, model, optimizer, data = prepared()
    inner = optimizer.optimizer
    original = inner.step
    calls = []

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise FloatingPointError("the loss went NaN")
        return original(*args, **kwargs)

    inner.step = step
    with attach(accelerator, model, optimizer, data, output_dir=tmp_path, schedule=None, console=False):
        for x, y in data:
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            with contextlib.suppress(FloatingPointError):
                optimizer.step()
            optimizer.zero_grad()
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(calls) == 8 and report["steps"] == 7 and report["global_step"] == 7


@pytest.mark.parametrize(("args", "kwargs", "error", "match"), [
    (("not a model",), {}, TypeError, "model must be a torch.nn.Module"),
    ((), {"max_traces": 0}, ValueError, "max_traces must be an integer >= 1"),
    ((), {"bogus": 1}, TypeError, r"attach got unknown argument\(s\) bogus"),
])
def test_bad_arguments(tmp_path: Path, args: tuple, kwargs: dict, error: type, match: str) -> None:
    accelerator, model, optimizer, data = prepared()
    call_args = (accelerator, *args, optimizer, data) if args else (accelerator, model, optimizer, data)
    with pytest.raises(error, match=match):
        attach(*call_args, output_dir=tmp_path, **kwargs)


def test_accelerator_must_be_an_accelerator(tmp_path: Path) -> None:
    _, model, optimizer, data = prepared()
    with pytest.raises(TypeError, match=r"accelerator must be an accelerate\.Accelerator"):
        attach(object(), model, optimizer, data, output_dir=tmp_path)


# ------------------------------------------------------------------ fidelity on the loops users write
def sized_setup(models: int = 1, batches: int = 24, accumulate: int = 1, **accelerator_args):
    from helpers import sized_loader, sized_mlp

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate, **accelerator_args)
    nets = [sized_mlp() for _ in range(models)]
    optimizers = [torch.optim.SGD(net.parameters(), lr=1e-3) for net in nets]
    prepared_objects = accelerator.prepare(*nets, *optimizers, sized_loader(batches))
    return accelerator, list(prepared_objects[:models]), list(prepared_objects[models:2 * models]), prepared_objects[-1]


def test_attach_with_no_objects_watches_what_was_prepared_and_a_resumed_epoch(tmp_path: Path) -> None:
    accelerator, (model,), (optimizer,), data = sized_setup(batches=24)
    with attach(accelerator, output_dir=tmp_path, schedule=None, console=False) as session:
        resumed = accelerator.skip_first_batches(data, 8)  # the epoch a checkpoint was taken in
        for epoch_loader in (resumed, data):
            for x, y in epoch_loader:
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == 16 + 24 and report["global_step"] == 40
    assert report["coverage"] >= 0.9
    assert type(resumed).__iter__ is not session  # the skipping loader is restored too
    assert "perfhooks" not in type(resumed).__dict__.get("__module__", "")


def test_two_models_and_two_optimizers_make_one_step_per_iteration(tmp_path: Path) -> None:
    accelerator, (first, second), (first_opt, second_opt), data = sized_setup(models=2, batches=20)
    with attach(accelerator, output_dir=tmp_path, schedule=None, console=False):
        for x, y in data:
            loss = nn.functional.mse_loss(first(x), y)
            accelerator.backward(loss)
            first_opt.step()
            first_opt.zero_grad()
            loss = nn.functional.mse_loss(second(x), y)
            accelerator.backward(loss)
            second_opt.step()
            second_opt.zero_grad()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == 20 and report["micro_batches"] == 20
    # Each step's phases cover it (the median step: one preemption in a ms-long step is not the code's doing)
    series = report["series"]
    per_step = [1 - other / total for other, total in zip(series["other"], (
        sum(values) for values in zip(*(series[name] for name in ("data_wait", "forward", "backward", "optimizer",
                                                                  "other")), strict=True)), strict=True) if total > 0]
    assert statistics.median(per_step) >= 0.9


def test_accumulation_and_an_optimizer_whose_step_does_nothing(tmp_path: Path) -> None:
    """DeepSpeed's optimizer wrapper steps inside backward and its ``step`` is empty: steps still end."""

    class EmptyStep:  # what accelerate's DeepSpeedOptimizerWrapper.step is
        def step(self, closure=None):
            pass

        def zero_grad(self, set_to_none=True):
            pass

    accelerator, (model,), _, data = sized_setup(batches=24, accumulate=4)
    optimizer = EmptyStep()
    with warnings.catch_warnings(), \
            attach(accelerator, model, optimizer, data, output_dir=tmp_path, schedule=None, console=False):
        warnings.simplefilter("error", PerfhooksWarning)  # no fault of perfhooks' own on such an optimizer
        for x, y in data:
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                optimizer.step()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == 6 and report["micro_batches"] == 24


def test_evaluation_loop_is_evaluation_and_save_state_is_checkpointing(tmp_path: Path) -> None:
    import time

    from helpers import sized_loader

    accelerator, (model,), (optimizer,), data = sized_setup(batches=12)
    evaluation = accelerator.prepare(sized_loader(4, seed=1))
    with attach(accelerator, output_dir=tmp_path / "perf", schedule=None, console=False):
        for step, (x, y) in enumerate(data):
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            if step == 5:
                model.eval()
                with torch.no_grad():
                    for ex, ey in evaluation:
                        time.sleep(0.1)
                        nn.functional.mse_loss(model(ex), ey)
                model.train()
                accelerator.save_state(str(tmp_path / "state"))
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    run = report["run"]
    assert report["steps"] == 12
    assert run["evaluations"] == 1 and run["evaluation_s"] >= 0.4  # four 100 ms batches
    assert run["checkpoints"] == 1 and run["checkpointing_s"] > 0
    # The evaluation counted as data wait or inside a step would make one last at least as long: compared within
    # this run, with room for a preempted step on a busy machine (CI once saw a 435 ms fetch beside a 633 ms
    # evaluation, with the other core loaded)
    evaluation_ms = 1e3 * run["evaluation_s"]
    assert report["phases"]["data_wait"]["max_ms"] < 0.9 * evaluation_ms
    assert longest_step_after_the_first_ms(report) < 0.9 * evaluation_ms


def test_a_fault_while_wiring_is_a_warning_and_the_loop_runs(tmp_path: Path) -> None:
    class Slotted:  # no instance dict: its step cannot be wrapped
        __slots__ = ()

        def step(self, closure=None):
            pass

    accelerator, (model,), _, data = sized_setup(batches=4)
    with pytest.warns(PerfhooksWarning, match="attach failed"):
        session = attach(accelerator, model, Slotted(), data, output_dir=tmp_path, schedule=None, console=False)
    for x, y in data:
        accelerator.backward(nn.functional.mse_loss(model(x), y))
    assert session.close() is None
    assert type(data).__module__.startswith("accelerate")


@pytest.mark.parametrize("apart", [True, False])
def test_the_report_goes_to_accelerates_folder_for_logs(tmp_path: Path, apart: bool) -> None:
    """Issue 74: a report beside the checkpoints was deleted with them; accelerate's folder for logs is
    ``logging_dir``, which is ``project_dir`` unless the job sets it apart."""
    from accelerate.utils import ProjectConfiguration

    logs = tmp_path / "logs" if apart else None
    project = ProjectConfiguration(project_dir=str(tmp_path / "job"), logging_dir=str(logs) if logs else None)
    accelerator = Accelerator(cpu=True, project_config=project)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer, data = accelerator.prepare(model, optimizer, random_loader(4))
    with attach(accelerator, model, optimizer, data, schedule=None, console=False):
        train_epoch(accelerator, model, optimizer, data)
    expected = (logs if apart else tmp_path / "job") / "perfhooks_out" / "report.json"
    assert json.loads(expected.read_text())["steps"] == 4
    assert (project.project_dir, project.logging_dir) == (str(tmp_path / "job"), str(logs or tmp_path / "job"))
