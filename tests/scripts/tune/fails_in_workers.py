"""A short Lightning script whose dataset cannot be read from DataLoader worker processes (it holds a handle that
does not survive the fork, as a database connection would): the workers trial fails, the others go on.

    python fails_in_workers.py ROOT
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from slow_data import SlowSamples


class MainProcessOnly(SlowSamples):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("this dataset cannot be read from worker processes")
        return super().__getitem__(index)


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(32, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(MainProcessOnly(samples=256, sample_s=0.001), batch_size=8)
    L.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=sys.argv[1], enable_progress_bar=False).fit(
        Regression(), loader)
