"""What perfhooks puts on a user's objects travels with them nowhere and keeps them alive never (issue 76): the
five cases accelerate's own suite broke, with a real ``Accelerator``, and the same checks for Lightning's and
transformers' Trainers. Each object pickles and deep-copies while attached, a copy carries nothing of the run,
and an object the program drops is freed at once, as plain, with no ``gc.collect()``."""

from __future__ import annotations

import copy
import gc
import json
import multiprocessing
import pickle
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from helpers import mlp, random_loader
from perfhooks.integrations.accelerate import attach


def attached_epoch(accelerator: Any, folder: str | Path, batches: int) -> Any:
    """``attach``, then prepare a model, an optimizer and a loader of ``batches`` and train one epoch; the session
    (open)."""
    session = attach(accelerator, output_dir=folder, console=False)
    model, optimizer, loader = accelerator.prepare(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1),
                                                   random_loader(batches))
    session.watch_prepared()
    for x, y in loader:
        accelerator.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    return session, optimizer, loader


def carries_nothing_of_perfhooks(copied: Any) -> None:
    """No attribute of the copy (nor of its hooks) is perfhooks' own: no engine, no session, no wrapper."""
    blob = pickle.dumps(copied)
    for name in (b"perfhooks.runtime.engine", b"PerfSession", b"noting_errors", b"Patched", b"WeakBound"):
        assert name not in blob, name


def test_an_attached_accelerator_its_optimizer_and_loader_pickle_and_copy_as_plain(tmp_path: Path) -> None:
    """accelerate's test_can_pickle_dataloader and test_accelerated_optimizer_pickling: the wrappers on the
    Accelerator (``backward``, ``save_state``, ...), on the prepared optimizer (``step``) and the loader's swapped
    class pickled as local objects."""
    accelerator = Accelerator(cpu=True)
    session, optimizer, loader = attached_epoch(accelerator, tmp_path, 4)
    for thing in (accelerator, optimizer, loader):
        for copied in (pickle.loads(pickle.dumps(thing)), copy.deepcopy(thing)):
            assert type(copied).__name__ == type(thing).__name__
            carries_nothing_of_perfhooks(copied)
    again = pickle.loads(pickle.dumps(accelerator))
    assert again.backward.__func__ is type(accelerator).backward  # the class's method, bound to the copy
    assert [batch[0].shape for batch in pickle.loads(pickle.dumps(loader))] == [batch[0].shape for batch in loader]
    report = session.close()
    assert report["steps"] == 4 and report["faults"] == []
    assert "backward" not in accelerator.__dict__ and type(loader).__iter__ is not None  # put back


def test_an_unwrapped_model_with_perfhooks_hook_pickles_and_runs(tmp_path: Path) -> None:
    """accelerate's test_can_unwrap_model: the forward pre-hook, a local function, stayed on the unwrapped model."""
    accelerator = Accelerator(cpu=True)
    session = attach(accelerator, output_dir=tmp_path, console=False)
    model = accelerator.prepare(nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 1)))
    session.watch_prepared()
    inputs = torch.randn(10, 2)
    model(inputs)
    unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    loaded = pickle.loads(pickle.dumps(unwrapped))
    assert torch.equal(loaded(inputs), unwrapped(inputs))
    carries_nothing_of_perfhooks(loaded)
    assert torch.equal(copy.deepcopy(unwrapped)(inputs), unwrapped(inputs))
    session.close()


def test_a_dropped_accelerator_and_its_loader_are_freed_at_once_and_the_run_ends_itself(tmp_path: Path) -> None:
    """accelerate's test_ensure_dataloader_gets_cleaned_up, with perfhooks attached and its session left open:
    the watch thread held the Accelerator through the W&B source's lambda; the wrappers held it in cycles."""

    class Dummy:
        def __init__(self) -> None:
            self.accelerator = Accelerator(cpu=True)
            self.session = attach(self.accelerator, output_dir=tmp_path, console=False)
            self.dataloader = self.accelerator.prepare_data_loader(DataLoader(list(range(16)), batch_size=4))
            self.session.watch_prepared()
            self.iter = iter(self.dataloader)

        def __call__(self) -> Any:
            return next(self.iter)

    instance = Dummy()
    assert instance().tolist() == [0, 1, 2, 3]
    session = instance.session
    refs = [weakref.ref(instance.accelerator), weakref.ref(instance.dataloader),
            weakref.ref(instance.dataloader.gradient_state)]
    del instance
    assert [ref() is None for ref in refs] == [True, True, True]
    deadline = time.monotonic() + 60  # the watch thread closes it (its close marks it closed, then writes)
    while session.engine.final_report is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session.engine.closed and session.engine.final_report["status"] == "completed"
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "completed"


def _child(folder: str, rank: int) -> None:
    attached_epoch(Accelerator(cpu=True), f"{folder}/child{rank}", 3)
    # the child returns without closing: multiprocessing ends it with os._exit


def test_a_forked_child_writes_its_own_report_and_leaves_the_parents_alone(tmp_path: Path) -> None:
    """accelerate's debug_launcher forks ranks from an attached process: 10 of 30 children's folders were empty,
    each child exiting (os._exit) without its session closing."""
    accelerator = Accelerator(cpu=True)
    parent = attach(accelerator, output_dir=tmp_path / "parent", console=False)
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_child, args=(str(tmp_path), rank)) for rank in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [child.exitcode for child in children] == [0, 0]
    for rank in range(2):
        report = json.loads((tmp_path / f"child{rank}" / "report.json").read_text())
        assert (report["status"], report["steps"]) == ("completed", 3)
    assert not (tmp_path / "parent" / "report.json").exists()  # a child never writes the parent's run
    assert parent.close()["status"] == "completed"


# ----------------------------------------------------------------------------- Lightning and transformers
import lightning as L  # noqa: E402


class Regression(L.LightningModule):
    """A module-level LightningModule (a local class would not pickle, plain or profiled)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_lightning_models_and_optimizers_pickle_mid_fit_and_the_trainer_is_freed_after_fit(tmp_path: Path) -> None:
    from perfhooks.integrations.lightning import PerfCallback

    copied: list[Any] = []

    class Copies(L.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, *_args: Any) -> None:
            if trainer.global_step == 3:
                copied.extend(pickle.loads(pickle.dumps(thing)) for thing in (module, trainer.optimizers[0]))
                copied.append(copy.deepcopy(module))

    trainer = L.Trainer(max_steps=6, default_root_dir=tmp_path, callbacks=[PerfCallback(console=False), Copies()],
                        enable_progress_bar=False, accelerator="cpu")
    trainer.fit(Regression(), random_loader(8))  # a module the test kept would hold the trainer (its _trainer)
    assert len(copied) == 3
    for thing in copied:
        carries_nothing_of_perfhooks(thing)
    gone = weakref.ref(trainer)
    del trainer
    gc.collect()  # the framework's own Trainer holds cycles (its loops refer back to it), plain as profiled
    assert gone() is None


def test_an_hf_trainers_model_and_optimizer_pickle_mid_train_and_the_trainer_is_freed_after_train(
        tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from perfhooks.integrations.transformers import PerfTrainerCallback

    copied: list[Any] = []

    class Copies(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                        **kwargs: Any) -> None:
            if state.global_step == 2:  # the optimizer does not pickle plain (the LR scheduler's weakref on step)
                copied.extend(pickle.loads(pickle.dumps(thing)) for thing in (model, copy.deepcopy(model)))

    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    model = GPT2LMHeadModel(config)
    data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(16)]
    arguments = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                                  report_to="none", use_cpu=True, save_strategy="no", logging_steps=1)
    trainer = Trainer(model=model, args=arguments, train_dataset=data,
                      callbacks=[PerfTrainerCallback(console=False), Copies()])
    trainer.train()
    assert len(copied) == 2
    for thing in copied:
        carries_nothing_of_perfhooks(thing)
    gone = weakref.ref(trainer)
    del trainer
    gc.collect()  # the framework's own Trainer holds cycles (its loops refer back to it), plain as profiled
    assert gone() is None


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
