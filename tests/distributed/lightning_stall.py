"""Lightning ``strategy="ddp"`` on 2 CPU processes whose rank 1 ``Dataset.__getitem__`` sleeps once; run by
test_distributed.py with ``PERFHOOKS_STALL_AFTER_S``, node-local output folders (``node<LOCAL_RANK>``) and
Lightning's defaults on (its logger, checkpoints, progress bar, model summary, validation every 10 steps).

    python tests/distributed/lightning_stall.py OUTPUT_ROOT

SLEEP_S: how long rank 1 sleeps at its 12th sample of the run. It prints ``sleeping`` before it does.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils.data import DataLoader, Dataset

import perfhooks
from helpers import default_trainer, lightning_mlp, random_loader
from perfhooks.integrations.lightning import PerfCallback

BATCH = 4


class SleepsOnce(Dataset):
    """Samples for lightning_mlp; on rank 1, the 12th sample fetched sleeps ``SLEEP_S`` seconds."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.fetched = 0

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.fetched += 1
        if self.fetched == 12 and os.environ.get("LOCAL_RANK", "0") == "1":
            print("sleeping", flush=True)
            time.sleep(float(os.environ.get("SLEEP_S", "15")))
        generator = torch.Generator().manual_seed(index)
        return torch.randn(32, generator=generator), torch.randn(1, generator=generator)


def main(root: str) -> int:
    folder = Path(root) / f"node{os.environ.get('LOCAL_RANK', '0')}"
    callback = PerfCallback(output_dir=folder, console=False, analyze_windows=False,
                            schedule=perfhooks.Schedule(skip_first=3, warmup=1, active=2))
    trainer = default_trainer(Path(root) / "lightning", max_steps=12, strategy="ddp", devices=2,
                              callbacks=[callback], val_check_interval=10, limit_val_batches=2)
    trainer.fit(lightning_mlp(), DataLoader(SleepsOnce(12 * BATCH * 2), batch_size=BATCH), random_loader(4, seed=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
