"""A short Lightning script that fails when trained in bf16 (an op the user's model does not support in it): the
trial ``perfhooks tune`` reports as failed while the others go on.

    python fails_under_bf16.py ROOT
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from slow_data import SlowSamples


class Fussy(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(32, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("this model does not train under autocast")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(SlowSamples(samples=256, sample_s=0.001), batch_size=8)
    L.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=sys.argv[1], enable_progress_bar=False).fit(
        Fussy(), loader)
