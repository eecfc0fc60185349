"""A hand-written accelerate loop (imports nothing from perfhooks).

    python accelerate_train.py PROJECT_DIR STEPS
"""

import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    project, steps = sys.argv[1], int(sys.argv[2])
    accelerator = Accelerator(cpu=True, project_dir=project, gradient_accumulation_steps=2)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)  # two prepare calls, as many scripts do
    x = torch.randn(steps * 2 * 8, 32, generator=torch.Generator().manual_seed(0))
    loader = accelerator.prepare(DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8))
    model.train()
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.wait_for_everyone()
    print(f"done rank {accelerator.process_index} of {accelerator.num_processes}")
