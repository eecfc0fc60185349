"""A plain PyTorch loop with no framework (imports nothing from perfhooks)."""

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(2, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("done plain")
