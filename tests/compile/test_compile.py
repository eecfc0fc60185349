"""torch.compile: perfhooks adds no graph break and changes no result, and tells what compilation cost.

Each framework runs the same compiled training twice, without perfhooks and with it, on the ``eager`` backend
(dynamo traces for real; only the code generation is skipped): the losses are equal to the last bit and dynamo
counts the same graph breaks (none, under ``fullgraph=True``) and the same graphs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from helpers import mlp, random_loader


def dynamo_counts() -> tuple[dict[str, int], int]:
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"]), int(counters["stats"]["unique_graphs"])


@pytest.fixture(autouse=True)
def _accelerate_state_kept(monkeypatch: pytest.MonkeyPatch):
    """accelerate keeps one ``AcceleratorState`` per process, dynamo plugin included: the first Accelerator's
    plugin would compile every later test's models. Each test here starts from a fresh state and leaves one, and
    the ACCELERATE_DYNAMO_* variables as it found them."""
    from accelerate.state import AcceleratorState

    for name in [name for name in os.environ if name.startswith("ACCELERATE_DYNAMO")]:
        monkeypatch.setenv(name, os.environ[name])
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
    fresh_dynamo()


def fresh_dynamo() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


# ----------------------------------------------------------------------------- accelerate (a hand-written loop)
def accelerate_run(tmp_path: Path | None, objects: bool, fullgraph: bool = True, batches=None,
                   dynamic: bool = False, backend: str = "eager") -> tuple[list[float], tuple, dict | None]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import TorchDynamoPlugin

    from perfhooks.integrations.accelerate import attach

    fresh_dynamo()
    torch.manual_seed(0)
    AcceleratorState._reset_state(True)  # each run's own plugin (accelerate keeps the first one per process)
    for name in [name for name in os.environ if name.startswith("ACCELERATE_DYNAMO")]:
        del os.environ[name]  # each run's plugin from its own arguments only
    if dynamic:  # the user compiles it, dynamic (accelerate's plugin passed dynamic=True still specialized here)
        accelerator = Accelerator(cpu=True)
        model = torch.compile(mlp(), backend="eager", dynamic=True)
    else:
        accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend=backend, fullgraph=fullgraph))
        model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, batches or random_loader(12))
    session = None
    if tmp_path is not None:
        settings = {"output_dir": tmp_path, "console": False, "schedule": None}
        session = attach(accelerator, model, optimizer, loader, **settings) if objects else attach(accelerator,
                                                                                                  **settings)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    report = session.close() if session is not None else None
    return losses, dynamo_counts(), report


@pytest.mark.parametrize("objects", [True, False], ids=["attach_objects", "attach_accelerator"])
def test_accelerate_fullgraph_trains_as_without_perfhooks(tmp_path: Path, objects: bool) -> None:
    bare_losses, bare_counts, _ = accelerate_run(None, objects)
    losses, counts, report = accelerate_run(tmp_path, objects)
    assert losses == bare_losses, "the same losses, to the last bit"
    assert counts == bare_counts == ({}, 1), "no graph break, the same graphs"
    run = report["run"]
    assert run["compilations"] >= 1 and run["compiling_s"] > 0
    assert report["compile"]["compiled_steps"] == [0] and report["steady"]["compiled_steps"] == 1
    first_wait_ms = report["series"]["data_wait"][0]
    assert run["compiling_s"] * 1e3 > 10 * first_wait_ms, "compile time is not data wait (measured in this run)"
    assert report["phases"]["forward"]["mean_ms"] > 0, "the compiled forward is timed (it starts with the batch)"
    assert not {"recompiles", "graph_breaks"} & {d["id"] for d in report["diagnoses"]}


@pytest.mark.slow
def test_accelerate_fullgraph_with_inductor_trains_as_without_perfhooks(tmp_path: Path) -> None:
    """Inductor once (a C compiler is here): the same graphs, no break, and losses equal to the last bit."""
    bare_losses, bare_counts, _ = accelerate_run(None, objects=True, backend="inductor")
    losses, counts, report = accelerate_run(tmp_path, objects=True, backend="inductor")
    assert losses == bare_losses and counts == bare_counts == ({}, 1)
    assert report["run"]["compiling_s"] > 0 and report["compile"]["compiled_steps"] == [0]


def test_a_shape_that_changes_every_step_recompiles_and_a_dynamic_one_does_not(tmp_path: Path) -> None:
    def varying():  # batches of 4, 5, ... 9 samples: the leading dimension changes every step
        sizes = (4, 5, 6, 7, 8, 9)
        data = torch.utils.data.TensorDataset(torch.randn(sum(sizes), 32), torch.randn(sum(sizes), 1))
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return torch.utils.data.DataLoader(data, batch_sampler=[list(range(start, start + size))
                                                                 for start, size in zip(starts, sizes, strict=True)])

    _, _, report = accelerate_run(tmp_path / "varying", objects=True, fullgraph=False, batches=varying())
    recompiles = next(d for d in report["diagnoses"] if d["id"] == "recompiles")
    assert recompiles["measured"]["recompiles"] >= 1
    assert "size mismatch at index 0" in recompiles["evidence"], "dynamo names the dimension that changed"
    assert report["compile"]["recompiles"]["count"] == recompiles["measured"]["recompiles"]

    _, _, dynamic = accelerate_run(tmp_path / "dynamic", objects=True, fullgraph=False, batches=varying(),
                                   dynamic=True)
    _, _, fixed = accelerate_run(tmp_path / "fixed", objects=True, fullgraph=False)
    for quiet in (dynamic, fixed):
        assert "recompiles" not in {d["id"] for d in quiet["diagnoses"]}
        assert quiet["compile"]["recompiles"]["count"] == 0


def test_a_graph_break_in_the_users_forward_is_named_with_its_line(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from perfhooks.integrations.accelerate import attach

    class Talkative(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            hidden = self.net[0](x)
            print(end="")  # a graph break
            return self.net[1:](hidden)

    fresh_dynamo()
    accelerator = Accelerator(cpu=True)
    model = torch.compile(Talkative(), backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, random_loader(6))
    with attach(accelerator, model, optimizer, loader, output_dir=tmp_path, console=False, schedule=None):
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    report = json.loads((tmp_path / "report.json").read_text())
    breaks = next(d for d in report["diagnoses"] if d["id"] == "graph_breaks")
    assert breaks["measured"]["graph_breaks"] >= 1 and breaks["measured"]["graphs"] >= 2
    assert any("test_compile.py:" in site and "print" in site.lower() for site in breaks["measured"]["sites"])


# ----------------------------------------------------------------------------- Lightning
def lightning_run(tmp_path: Path, with_perf: bool) -> tuple[list[float], tuple]:
    from helpers import lightning_mlp, quiet_trainer
    from perfhooks.integrations.lightning import PerfCallback

    fresh_dynamo()
    torch.manual_seed(0)
    module = lightning_mlp()
    losses: list[float] = []
    original = module.training_step

    def training_step(batch, batch_idx):
        loss = original(batch, batch_idx)
        losses.append(float(loss.detach()))
        return loss

    module.training_step = training_step
    module.net = torch.compile(module.net, backend="eager", fullgraph=True)
    callbacks = [PerfCallback(output_dir=tmp_path / "perf", console=False, schedule=None)] if with_perf else []
    quiet_trainer(max_steps=6, callbacks=callbacks, default_root_dir=tmp_path).fit(module, random_loader(12))
    return losses, dynamo_counts()


def test_lightning_fullgraph_trains_as_without_perfhooks(tmp_path: Path) -> None:
    bare = lightning_run(tmp_path / "bare", with_perf=False)
    with_perf = lightning_run(tmp_path / "perf", with_perf=True)
    assert with_perf == bare and bare[1] == ({}, 1)
    report = json.loads((tmp_path / "perf" / "perf" / "report.json").read_text())
    assert report["run"]["compiling_s"] > 0 and report["steps"] == 6


# ----------------------------------------------------------------------------- transformers
def hf_run(tmp_path: Path, with_perf: bool) -> tuple[list[float], tuple]:
    from transformers import Trainer, TrainingArguments

    from hf_trainer_example import SyntheticTokens, tiny_gpt2
    from perfhooks.integrations.transformers import PerfTrainerCallback

    fresh_dynamo()
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2,
                             torch_compile=True, torch_compile_backend="eager", report_to=[], logging_steps=1,
                             save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    callbacks = [PerfTrainerCallback(console=False, schedule=None)] if with_perf else []
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=SyntheticTokens(16), callbacks=callbacks)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], dynamo_counts()


def test_transformers_torch_compile_adds_no_graph_break(tmp_path: Path) -> None:
    bare = hf_run(tmp_path / "bare", with_perf=False)
    with_perf = hf_run(tmp_path / "perf", with_perf=True)
    assert with_perf[0] == bare[0], "the same losses"
    assert with_perf[1] == bare[1], "the same graph breaks and graphs as without perfhooks"
    report = json.loads((tmp_path / "perf" / "_perfhooks" / "report.json").read_text())
    assert report["run"]["compiling_s"] > 0
    assert report["phases"]["forward"]["mean_ms"] > 0 and report["phases"]["backward"]["mean_ms"] > 0


def test_module_ranges_on_a_compiled_model_say_once_what_they_cannot_show(tmp_path: Path) -> None:
    import warnings

    from perfhooks import Engine, PerfConfig, PerfhooksWarning

    class Net(torch.nn.Module):  # the user's own module (dynamo skips torch's own modules as entry frames)
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return self.net(x)

    fresh_dynamo()
    model = Net()
    model.compile(backend="eager", fullgraph=True)  # in place: the module's own call is compiled
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, module_ranges=True), tmp_path, "test")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.watch_model(model)
        engine.watch_model(model)
        for _ in range(3):
            engine.fetch()
            engine.phase_start("forward")
            loss = model(torch.randn(4, 32)).square().mean()
            engine.phase_start("backward")
            loss.backward()
            engine.stepped()
    engine.close()
    said = [str(w.message) for w in caught if issubclass(w.category, PerfhooksWarning)]
    assert [m for m in said if "torch.compile region" in m] == [said[0]] and len(said) == 1
    assert dynamo_counts() == ({}, 1), "the ranges' hooks added no graph break under fullgraph"


def test_an_evaluation_under_no_grad_recompiles_once_and_gets_the_evaluations_fix(tmp_path: Path) -> None:
    """dynamo's reason is a grad-mode change (``GLOBAL_STATE changed: grad_mode``), not a shape: the fix is to
    evaluate uncompiled or compile the evaluation apart, not ``mark_dynamic``; its share is of the run."""
    import perfhooks

    fresh_dynamo()
    torch.manual_seed(0)
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfhooks.profile(compiled, optimizer, output_dir=tmp_path, console=False, schedule=None) as perf:
        for step in range(12):
            with perf.data_wait():
                x, y = torch.randn(8, 32), torch.randn(8, 1)
            torch.nn.functional.mse_loss(compiled(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 4 == 3:
                with perf.evaluation(), torch.no_grad():
                    compiled(torch.randn(8, 32))
    report = json.loads((tmp_path / "report.json").read_text())
    verdict = next(d for d in report["diagnoses"] if d["id"] == "recompiles")
    assert any("grad_mode" in reason for reason in verdict["measured"]["reasons"])
    assert verdict["measured"]["mode_change"] and verdict["severity"] == "info"
    assert "mark_dynamic does not apply" in verdict["recommendation"] and "_orig_mod" in verdict["recommendation"]
    assert verdict["gain_basis"] == "run" and "of the run's wall time" in verdict["evidence"]
    assert verdict["estimated_gain"] == pytest.approx(report["run"]["compiling_s"] / report["run"]["wall_s"],
                                                      abs=1e-3)
