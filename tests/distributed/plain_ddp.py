"""A 2-rank CPU DDP loop (gloo) driving the engine directly; started by torchrun from test_distributed.py.

    torchrun --nproc-per-node 2 tests/distributed/plain_ddp.py OUTPUT_DIR

Environment: SLOW_RANK (that rank sleeps SLOW_MS in each forward), SLOW_EXPORT_S (rank 1's trace
export sleeps that long first, as on a slow filesystem), PG_TIMEOUT_S (the process group's timeout),
PER_RANK_DIRS (each rank writes to OUTPUT_DIR/rank<R>, as node-local disks), VANISH_RANK (that rank
leaves with os._exit(0) before perfhooks' end: it never reports).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfhooks
from helpers import mlp

STEPS = 16


def main(output_dir: str) -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", 60))))
    rank = dist.get_rank()
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_MS", "30")) / 1e3
    slow_export_s = float(os.environ.get("SLOW_EXPORT_S", "0"))
    if slow_export_s and rank == 1:  # the trace export itself is slow (a slow or remote filesystem)
        export = torch.autograd.profiler.profile.export_chrome_trace

        def slow_export(self: object, *args: object, **kwargs: object) -> object:
            time.sleep(slow_export_s)
            return export(self, *args, **kwargs)

        torch.autograd.profiler.profile.export_chrome_trace = slow_export  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if os.environ.get("PER_RANK_DIRS"):
        output_dir = str(Path(output_dir) / f"rank{rank}")
    engine = perfhooks.Engine(perfhooks.PerfConfig(schedule=perfhooks.Schedule(skip_first=3, warmup=1, active=2),
                                                   console=bool(os.environ.get("CONSOLE")), analyze_windows=False),
                              output_dir, "torchrun")
    started = time.monotonic()
    for _ in range(STEPS):
        engine.phase_start("data_wait")
        x, y = torch.randn(32, 32), torch.randn(32, 32)
        engine.phase_start("forward")
        engine.batch((x, y))
        if rank == slow_rank:
            time.sleep(slow_s)
        loss = torch.nn.functional.mse_loss(model(x), y)
        engine.phase_start("backward")
        loss.backward()  # the gradient all-reduce: a collective every step
        engine.phase_start("optimizer")
        optimizer.step()
        optimizer.zero_grad()
        engine.step_end()
    print(f"rank {rank} trained {STEPS} steps in {time.monotonic() - started:.2f} s", flush=True)
    if rank == int(os.environ.get("VANISH_RANK", "-1")):
        os._exit(0)
    closing = time.monotonic()
    engine.close()
    print(f"rank {rank} closed in {time.monotonic() - closing:.2f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
