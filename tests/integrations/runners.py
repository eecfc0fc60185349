"""One way to run a tiny real training loop under each integration, for the contract tests.

Each runner trains for ``steps`` optimizer steps with ``accumulate`` micro-batches each and
``settings`` passed to the perfhooks adapter; ``fail_with`` is raised by the model's forward
at the third training forward, as the user's own bug would be; ``forward_s`` holds each training forward that
long (a floor on its time that a busy machine cannot lower).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from helpers import lightning_mlp, mlp, quiet_trainer, random_loader


def slow_forward(model: nn.Module, seconds: float) -> None:
    if seconds > 0:
        model.register_forward_pre_hook(
            lambda module, args: time.sleep(seconds) if module.training and torch.is_grad_enabled() else None)


def failing_forward(model: nn.Module, error: BaseException | None, at_call: int = 3) -> None:
    if error is None:
        return
    calls = {"n": 0}

    def hook(module: nn.Module, args: Any) -> None:
        if module.training and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == at_call:
                raise error

    model.register_forward_pre_hook(hook)


class LightningRunner:
    name = "lightning"

    def report_dir(self, out: Path) -> Path:
        return out

    def run(self, out: Path, steps: int, accumulate: int = 1, fail_with: BaseException | None = None,
            forward_s: float = 0.0, **settings: Any) -> Any:
        from perfhooks.integrations.lightning import PerfCallback

        settings.setdefault("console", False)
        callback = PerfCallback(output_dir=out, **settings)
        model = lightning_mlp()
        failing_forward(model.net, fail_with)
        slow_forward(model.net, forward_s)
        trainer = quiet_trainer(max_steps=steps, accumulate_grad_batches=accumulate, callbacks=[callback])
        trainer.fit(model, random_loader(steps * accumulate))
        return callback


class TransformersRunner:
    name = "transformers"

    def report_dir(self, out: Path) -> Path:
        return out

    def run(self, out: Path, steps: int, accumulate: int = 1, fail_with: BaseException | None = None,
            forward_s: float = 0.0, **settings: Any) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

        from hf_trainer_example import SyntheticTokens
        from perfhooks.integrations.transformers import PerfTrainerCallback

        settings.setdefault("console", False)
        callback = PerfTrainerCallback(output_dir=out, **settings)
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2))
        failing_forward(model, fail_with)
        slow_forward(model, forward_s)
        args = TrainingArguments(output_dir=str(out / "hf"), max_steps=steps, per_device_train_batch_size=4,
                                 gradient_accumulation_steps=accumulate, save_strategy="no", report_to="none",
                                 disable_tqdm=True, use_cpu=True, logging_steps=1000)
        trainer = Trainer(model=model, args=args, callbacks=[callback],
                          train_dataset=SyntheticTokens(steps * accumulate * 4, seq_len=16, vocab=128))
        trainer.train()
        return callback


class AccelerateRunner:
    name = "accelerate"

    def report_dir(self, out: Path) -> Path:
        return out

    def run(self, out: Path, steps: int, accumulate: int = 1, fail_with: BaseException | None = None,
            forward_s: float = 0.0, **settings: Any) -> Any:
        from accelerate import Accelerator

        from perfhooks.integrations.accelerate import attach

        settings.setdefault("console", False)
        torch.manual_seed(0)
        accelerator = Accelerator(gradient_accumulation_steps=accumulate, cpu=True)
        model = mlp()
        failing_forward(model, fail_with)
        slow_forward(model, forward_s)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        model, optimizer, data = accelerator.prepare(model, optimizer, random_loader(steps * accumulate))
        with attach(accelerator, model, optimizer, data, output_dir=out, **settings) as session:
            for x, y in data:
                with accelerator.accumulate(model):
                    loss = nn.functional.mse_loss(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
        return session


RUNNERS = {runner.name: runner for runner in (LightningRunner(), TransformersRunner(), AccelerateRunner())}
