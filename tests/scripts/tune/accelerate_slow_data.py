"""An unmodified hand-written accelerate loop whose dataset takes 4 ms a sample with batch 8 and no loader
workers; it saves its state when the epoch ends.

    python accelerate_slow_data.py OUTPUT_DIR
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from slow_data import SlowSamples

if __name__ == "__main__":
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, project_dir=sys.argv[1])
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowSamples(), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(sys.argv[1] + "/state")
