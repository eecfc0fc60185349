"""The accelerate adapter on a real Accelerator and a hand-written loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from helpers import mlp, random_loader
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


@pytest.mark.parametrize(("args", "kwargs", "error", "match"), [
    ((None,), {}, TypeError, "needs the prepared model"),
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
