"""A Lightning fit that runs out of memory at one place; run by test_reliability.py with and without perfhooks.

    python tests/scripts/oom_anywhere.py WHERE PERF OUTPUT_DIR

WHERE: forward, backward, optimizer or data (the DataLoader). PERF: 1 adds PerfCallback. The OOM is
``torch.OutOfMemoryError`` with CUDA's message, raised where a real one would surface.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfhooks
from helpers import lightning_mlp, quiet_trainer
from perfhooks.integrations.lightning import PerfCallback

AT_STEP = 5
MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB"


def oom() -> None:
    raise torch.OutOfMemoryError(MESSAGE)


class Batches(Dataset):
    def __init__(self, where: str) -> None:
        self.where = where

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.where == "data" and index == AT_STEP:
            oom()
        return torch.randn(32), torch.randn(32)


class RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        oom()
        return grad


def main(where: str, perf: bool, output_dir: str) -> int:
    model = lightning_mlp()
    calls = {"n": 0}

    def forward_hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == AT_STEP:
            if where == "forward":
                oom()
            if where == "backward":
                return RaiseInBackward.apply(output)
        return output

    model.net.register_forward_hook(forward_hook)
    trainer = quiet_trainer(max_steps=20, callbacks=[PerfCallback(
        output_dir=output_dir, console=False, schedule=perfhooks.Schedule(skip_first=3, warmup=1, active=3))]
        if perf else [])
    original = model.configure_optimizers

    def configure_optimizers() -> torch.optim.Optimizer:
        optimizer = original()
        steps = {"n": 0}

        def in_step(*args: Any) -> None:  # after the closure (forward, backward): in the update itself
            steps["n"] += 1
            if where == "optimizer" and steps["n"] == AT_STEP:
                oom()

        optimizer.register_step_post_hook(in_step)
        return optimizer

    model.configure_optimizers = configure_optimizers  # type: ignore[method-assign]
    trainer.fit(model, DataLoader(Batches(where), batch_size=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2] == "1", sys.argv[3]))
