"""RSS after each of many capture cycles (the leak check, after PyTorch's test_mem_leak); prints one line of JSON.

    python tests/scripts/capture_cycles_rss.py OUTPUT_DIR CYCLES
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfhooks
from helpers import mlp, train_steps


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def main(output_dir: str, cycles: int) -> int:
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # A window every 2 steps, forever; every perfhooks feature that runs on CPU is on.
    config = perfhooks.PerfConfig(schedule=perfhooks.Schedule(skip_first=0, wait=1, warmup=0, active=1, repeat=0),
                                  max_traces=2, console=False, analyze_windows=False, module_ranges=True)
    engine = perfhooks.Engine(config, output_dir, "leak-check")
    engine.watch_model(model)
    batches = [(torch.randn(16, 32), torch.randn(16, 32)) for _ in range(2)]

    def loss_of(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    samples = []
    for _ in range(cycles):
        train_steps(engine, loss_of, optimizer, batches)
        engine.writer.flush()
        samples.append(rss_bytes())
    engine.close()
    print(json.dumps({"rss": samples, "windows": len(engine.windows.snapshot())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], int(sys.argv[2])))
