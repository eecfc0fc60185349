"""A plain Lightning training script (imports nothing from perfhooks): defaults on, validation and checkpoints.

    python lightning_train.py ROOT STEPS [EXIT_CODE]
"""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def loader(batches: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batches * 8, 32, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


if __name__ == "__main__":
    root, steps = sys.argv[1], int(sys.argv[2])
    trainer = L.Trainer(accelerator="cpu", devices=1, default_root_dir=root, max_steps=steps,
                        val_check_interval=5, limit_val_batches=2, log_every_n_steps=2)
    trainer.fit(Regression(), loader(steps), loader(4))
    print(f"done {trainer.global_step}")
    if len(sys.argv) > 3:
        sys.exit(int(sys.argv[3]))
