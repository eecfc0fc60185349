"""A dataset whose ``__getitem__`` takes 4 ms a sample (a decode, a read from disk), shared by the tune scripts."""

from __future__ import annotations

import time

import torch


class SlowSamples(torch.utils.data.Dataset):
    """``samples`` (x, y) pairs of 32 features, the same on every run; each fetch sleeps ``sample_s``."""

    def __init__(self, samples: int = 1024, sample_s: float = 0.004) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, 32, generator=generator)
        self.y = torch.randn(samples, 1, generator=generator)
        self.sample_s = sample_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sample_s)
        return self.x[index], self.y[index]
