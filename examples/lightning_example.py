"""The README's main job: the tutorial transformer layer trained with Lightning and PerfCallback.

    python examples/lightning_example.py                 # CPU here, CUDA where present
    python examples/lightning_example.py --steps 60 --output-dir runs/perf

At the end a table is printed and ``<output-dir>/report.json`` and ``traces/`` are written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfhooks
from perfhooks.integrations.lightning import PerfCallback
from tutorial_transformer import lightning_module, make_dataloader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps (default 24)")
    parser.add_argument("--output-dir", default="perfhooks_out/lightning", help="perfhooks output folder")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = lightning_module(args.d_model, args.heads)
    data = make_dataloader(args.steps, args.batch_size, args.seq_len, args.d_model)
    callback = PerfCallback(output_dir=args.output_dir,
                            schedule=perfhooks.Schedule(skip_first=8, warmup=2, active=3, repeat=1))
    trainer = L.Trainer(max_steps=args.steps, accelerator="auto", devices=1, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(model, data)
    print(f"report: {Path(args.output_dir) / 'report.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
