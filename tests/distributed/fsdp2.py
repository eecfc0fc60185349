"""A 2-rank CPU FSDP2 (``fully_shard``) loop with gloo, driving the engine; started by torchrun.

    torchrun --nproc-per-node 2 tests/distributed/fsdp2.py OUTPUT_DIR

SLOW_RANK sleeps SLOW_MS inside its first layer's forward: under FSDP the other rank then waits in the
next layer's all-gather, inside *its* forward, so time outside backward cannot tell the ranks apart.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfhooks

STEPS = 12


def main(output_dir: str) -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
    if rank == int(os.environ.get("SLOW_RANK", "-1")):
        delay = float(os.environ.get("SLOW_MS", "30")) / 1e3
        model[0].register_forward_hook(lambda *args: time.sleep(delay))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    engine = perfhooks.Engine(perfhooks.PerfConfig(schedule=perfhooks.Schedule(skip_first=4, warmup=1, active=3),
                                                   console=False), output_dir, "torchrun")
    for _ in range(STEPS):
        engine.phase_start("data_wait")
        x = torch.randn(64, 256)
        engine.phase_start("forward")
        loss = model(x).square().mean()
        engine.phase_start("backward")
        loss.backward()
        engine.phase_start("optimizer")
        optimizer.step()
        optimizer.zero_grad()
        engine.step_end()
    engine.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
