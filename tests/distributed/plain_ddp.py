"""A 2-rank CPU DDP loop (gloo) driving the engine directly; started by torchrun from test_distributed.py.

    torchrun --nproc-per-node 2 tests/distributed/plain_ddp.py OUTPUT_DIR

Environment: SLOW_RANK (that rank sleeps SLOW_MS in each forward), SLOW_DATA_MS (every rank waits that long
for each batch), SLOW_EXPORT_S (rank 1's trace
export sleeps that long first, as on a slow filesystem), PG_TIMEOUT_S (the process group's timeout),
PER_RANK_DIRS (each rank writes to OUTPUT_DIR/rank<R>, as node-local disks), VANISH_RANK (that rank
leaves with os._exit(0) before perfhooks' end: it never reports), COUNT_STORE (count the store calls by
thread: store_calls.rank<R>.json gets the training thread's calls between the first step and the close).
The all-ranks trigger's variables (STEPS, default 16): trigger_env.py.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trigger_env

import perfhooks
from helpers import mlp
from perfhooks.distributed import store as rank_store


class CountingStore:
    """The real store, with every call counted by the thread that made it (while ``counting`` is on)."""

    def __init__(self, store: object) -> None:
        self._store = store
        self.counting = False
        self.calls: dict[str, list[str]] = {}

    def __getattr__(self, name: str) -> object:
        method = getattr(self._store, name)

        def counted(*args: object, **kwargs: object) -> object:
            if self.counting:
                self.calls.setdefault(threading.current_thread().name, []).append(name)
            return method(*args, **kwargs)

        return counted


def main(output_dir: str) -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", 60))))
    rank = dist.get_rank()
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_MS", "30")) / 1e3
    slow_export_s = float(os.environ.get("SLOW_EXPORT_S", "0"))
    slow_data_s = float(os.environ.get("SLOW_DATA_MS", "0")) / 1e3
    if slow_export_s and rank == 1:  # the trace export itself is slow (a slow or remote filesystem)
        export = torch.autograd.profiler.profile.export_chrome_trace

        def slow_export(self: object, *args: object, **kwargs: object) -> object:
            time.sleep(slow_export_s)
            return export(self, *args, **kwargs)

        torch.autograd.profiler.profile.export_chrome_trace = slow_export  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    output_dir = trigger_env.rank_folder(output_dir, rank)
    counting = None
    if os.environ.get("COUNT_STORE"):
        counting = CountingStore(rank_store.default_store())
        rank_store.default_store = lambda: counting  # type: ignore[assignment]
    steps = trigger_env.steps(16)
    schedule = trigger_env.schedule(perfhooks.Schedule(skip_first=3, warmup=1, active=2))
    engine = perfhooks.Engine(perfhooks.PerfConfig(schedule=schedule, console=bool(os.environ.get("CONSOLE")),
                                                   analyze_windows=False, trigger_poll_s=0.2),
                              output_dir, "torchrun")
    started = time.monotonic()
    for step in range(steps):
        if step == 0 and counting is not None:
            counting.counting = True
        trigger_env.at_step(output_dir, rank, step)
        engine.phase_start("data_wait")
        x, y = torch.randn(32, 32), torch.randn(32, 32)
        time.sleep(slow_data_s)
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
    print(f"rank {rank} trained {steps} steps in {time.monotonic() - started:.2f} s", flush=True)
    if counting is not None:
        counting.counting = False
        training = counting.calls.get(threading.main_thread().name, [])
        (Path(output_dir) / f"store_calls.rank{rank}.json").write_text(json.dumps(
            {"training_thread": training, "all": {name: len(calls) for name, calls in counting.calls.items()}}))
    if rank == int(os.environ.get("VANISH_RANK", "-1")):
        os._exit(0)
    closing = time.monotonic()
    engine.close()
    print(f"rank {rank} closed in {time.monotonic() - closing:.2f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
