"""An unmodified accelerate loop with the settings a debugging session leaves behind: autograd anomaly detection on
and one intra-op thread, in fp32; a small model whose forward and backward hold the step. It saves its state when
the loop ends.

    python accelerate_debug_settings.py OUTPUT_DIR
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator

if __name__ == "__main__":
    torch.autograd.set_detect_anomaly(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, project_dir=sys.argv[1])
    layers = [layer for _ in range(6) for layer in (torch.nn.Linear(128, 128), torch.nn.GELU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(64 * 16, 128), torch.randn(64 * 16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(sys.argv[1] + "/state")
