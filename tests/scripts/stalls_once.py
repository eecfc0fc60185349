"""A loop whose Dataset.__getitem__ sleeps once, for tests/test_live.py: a stall in data_wait.

    python tests/scripts/stalls_once.py OUTPUT_DIR STALL_AT SLEEP_S

Prints ``step N`` after each step and ``sleeping`` just before the long fetch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils.data import DataLoader, Dataset

import perfhooks
from helpers import mlp


class SlowOnce(Dataset):
    def __init__(self, stall_at: int, sleep_s: float) -> None:
        self.stall_at, self.sleep_s = stall_at, sleep_s

    def __len__(self) -> int:
        return 40 * 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.stall_at * 8:
            print("sleeping", flush=True)
            time.sleep(self.sleep_s)
        time.sleep(0.002)
        return torch.randn(32)


def main() -> None:
    output_dir, stall_at, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowOnce(stall_at, sleep_s), batch_size=8)
    with perfhooks.profile(model, optimizer, output_dir=output_dir, schedule=None, console=False) as run:
        batches = iter(loader)
        for step in range(40):
            with run.data_wait():
                batch = next(batches)
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            print(f"step {step + 1}", flush=True)


if __name__ == "__main__":
    main()
