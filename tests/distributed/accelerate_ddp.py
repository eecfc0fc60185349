"""A hand-written accelerate loop on 2 CPU processes with attach(); started by ``accelerate launch``.

    accelerate launch --cpu --num_processes 2 tests/distributed/accelerate_ddp.py OUTPUT_DIR

It runs under torchrun as well. COMPILE: "1" compiles the model before ``prepare`` (``fullgraph=True``, eager
backend), so any graph break perfhooks added would raise (DDP's own forward can't be traced with
``fullgraph``). The all-ranks trigger's variables: trigger_env.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trigger_env

import perfhooks
from helpers import mlp, random_loader
from perfhooks.integrations.accelerate import attach


def main(output_dir: str) -> int:
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = mlp()
    if os.environ.get("COMPILE") == "1":
        model = torch.compile(model, backend="eager", fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = trigger_env.steps(12)
    rank = accelerator.process_index
    folder = trigger_env.rank_folder(output_dir, rank)
    model, optimizer, loader = accelerator.prepare(model, optimizer, random_loader(2 * steps))
    with attach(accelerator, model, optimizer, loader, output_dir=folder, console=False, analyze_windows=False,
                trigger_poll_s=0.2, schedule=trigger_env.schedule(perfhooks.Schedule(skip_first=3, warmup=1,
                                                                                     active=2))):
        for step, (x, y) in enumerate(loader):
            trigger_env.at_step(folder, rank, step)
            if accelerator.process_index == slow_rank:
                time.sleep(0.03)
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
