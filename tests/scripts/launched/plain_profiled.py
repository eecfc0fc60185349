"""A plain PyTorch loop that already uses perfhooks' one-line API (as nanoGPT's users add it)."""

import sys

import torch

import perfhooks

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with perfhooks.profile(model, optimizer, output_dir=sys.argv[1], console=False, wandb=False) as perf:
    for _ in range(3):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
print("done plain profiled")
