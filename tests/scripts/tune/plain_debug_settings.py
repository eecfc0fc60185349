"""An unmodified plain loop under perfhooks.profile, with the settings a debugging session leaves behind (autograd
anomaly detection on, one intra-op thread), its report in its own default folder (./perfhooks_out), which a tune
must never write over.

    python plain_debug_settings.py OUTPUT_DIR
"""

from __future__ import annotations

import sys

import torch

import perfhooks

if __name__ == "__main__":
    torch.autograd.set_detect_anomaly(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [layer for _ in range(6) for layer in (torch.nn.Linear(128, 128), torch.nn.GELU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with perfhooks.profile(model, optimizer) as perf:
        for step in range(60):
            with perf.data_wait():
                x, y = torch.randn(16, 128), torch.randn(16, 1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 20 == 19:
                with perf.evaluation(), torch.no_grad():
                    model(torch.randn(64, 128))
    with open(sys.argv[1] + ".done", "w") as done:  # the script's own output
        done.write("ok")
