"""A 2-rank CPU FSDP2 (``fully_shard``) loop with gloo, driving the engine; started by torchrun.

    torchrun --nproc-per-node 2 tests/distributed/fsdp2.py OUTPUT_DIR

SLOW_RANK sleeps SLOW_MS inside its first layer's forward: under FSDP the other rank then waits in the
next layer's all-gather, inside *its* forward, so time outside backward cannot tell the ranks apart.

NEAR_LIMIT=1: Adam, the model watched, and a memory capacity 100 MB above the resident memory at the start; at
step 6 the loop takes 300 MB more (touched), so the next sample is a near-limit capture with Adam's state in
place. Each rank writes its local shards' sizes to ``shards.rank{R}.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfhooks
from perfhooks.memory.monitor import cpu_usage

STEPS = 12


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    """The bytes of the local shards (FSDP2's reduce-scatter leaves a layer's gradients as views of one buffer)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


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
    near_limit = os.environ.get("NEAR_LIMIT") == "1"
    optimizer = (torch.optim.Adam if near_limit else torch.optim.SGD)(model.parameters(), lr=0.01)
    memory = {}
    if near_limit:
        memory = {"memory_capacity_bytes": int((cpu_usage()["rss_bytes"] + (100 << 20)) / 0.9),
                  "memory_threshold": 0.9, "memory_poll_s": 0.0}
    engine = perfhooks.Engine(perfhooks.PerfConfig(schedule=perfhooks.Schedule(skip_first=4, warmup=1, active=3),
                                                   console=False, **memory), output_dir, "torchrun")
    if near_limit:
        engine.watch_model(model)
    ballast = None
    for step in range(STEPS):
        if near_limit and step == 6:
            ballast = torch.ones(300 << 18)  # 300 MB of float32, written, so resident
        engine.phase_start("data_wait")
        x = torch.randn(64, 256)
        engine.phase_start("forward")
        loss = model(x).square().mean()
        engine.phase_start("backward")
        loss.backward()
        engine.phase_start("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=not near_limit)  # NEAR_LIMIT: gradients stay allocated between steps
        engine.step_end()
    if near_limit:
        parameters = list(model.parameters())
        state = [t for entry in optimizer.state.values() for t in entry.values() if isinstance(t, torch.Tensor)]
        (Path(output_dir) / f"shards.rank{rank}.json").write_text(json.dumps({
            "parameters_bytes": _local_bytes(parameters), "gradients_bytes": _local_bytes(
                [p.grad for p in parameters if p.grad is not None]), "optimizer_state_bytes": _local_bytes(state)}))
    del ballast
    engine.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
