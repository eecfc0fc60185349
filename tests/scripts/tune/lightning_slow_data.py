"""An unmodified Lightning script, its defaults on (logger, checkpoints, progress bar), whose dataset takes 4 ms a
sample with batch 8 and ``num_workers=0``: the run ``perfhooks tune`` is tested on.

    python lightning_slow_data.py ROOT
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from slow_data import SlowSamples


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    L.seed_everything(0)
    loader = torch.utils.data.DataLoader(SlowSamples(), batch_size=8, shuffle=True, num_workers=0)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=sys.argv[1])
    trainer.fit(Regression(), loader)
    trainer.save_checkpoint(f"{sys.argv[1]}/final.ckpt")
