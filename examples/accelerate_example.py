"""A hand-written accelerate loop on the tutorial transformer layer, wired with one attach() call.

    python examples/accelerate_example.py [--steps 24] [--accumulate 1] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfhooks
from perfhooks.integrations.accelerate import attach
from tutorial_transformer import TransformerLayer, make_dataloader


def train(output_dir: str, steps: int = 24, accumulate: int = 1, d_model: int = 512, heads: int = 8,
          batch_size: int = 16, seq_len: int = 128, **settings: object) -> dict:
    torch.manual_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=accumulate, cpu=not torch.cuda.is_available())
    model = TransformerLayer(d_model, heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = make_dataloader(steps * accumulate, batch_size, seq_len, d_model)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    settings.setdefault("schedule", perfhooks.Schedule(skip_first=8, warmup=2, active=3))
    with attach(accelerator, model, optimizer, data, output_dir=output_dir, **settings) as perf:
        for x, y in data:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    return perf.engine.report()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--output-dir", default="perfhooks_out/accelerate")
    parser.add_argument("--d-model", type=int, default=512)
    args = parser.parse_args(argv)
    report = train(args.output_dir, args.steps, args.accumulate, d_model=args.d_model,
                   heads=max(1, args.d_model // 64))
    print(f"report: {Path(args.output_dir) / 'report.json'} (coverage {report['coverage']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
