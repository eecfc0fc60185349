"""The probe of the fourth call (the lines it ran, laid out one statement a line; perfhooks from the working tree):
is the timing reader's GIL-free timer bound on a real CUDA device, and did its first answer agree with torch's."""

import time

import torch

import perfhooks

device = "cuda"
model = torch.nn.Linear(256, 256).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
perf = perfhooks.profile(model, optimizer, output_dir="/tmp/pp", console=False, schedule=None)
for _ in range(400):
    model(torch.randn(64, 256, device=device)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
time.sleep(0.5)
clock = perf.engine.clock
print("timer bound", getattr(clock, "_timer", None) is not None, "checked", getattr(clock, "_timer_checked", None))
report = perf.close()
print("steps", report["steps"], "faults", report["faults"], "backward", report["phases"]["backward"])
