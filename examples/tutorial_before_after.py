"""Before and after: the profiler tutorial's baseline layer, then its optimized layer, each trained with
Lightning and PerfCallback, then ``perfhooks diff`` of the two runs.

    python examples/tutorial_before_after.py                     # CPU here, CUDA where present
    python examples/tutorial_before_after.py --output-dir runs/tutorial --steps 30

The baseline runs attention through ``nn.MultiheadAttention`` (the unfused math path) in FP32. The optimized
layer calls ``scaled_dot_product_attention``; on CUDA it also trains under bf16 autocast
(``precision="bf16-mixed"``). The same comparison from the command line:

    perfhooks diff runs/tutorial/baseline runs/tutorial/optimized
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
from perfhooks.offline.diff import compare, format_text, load_side
from tutorial_transformer import lightning_module, make_dataloader


def train(output_dir: Path, optimized: bool, steps: int, d_model: int, batch_size: int, seq_len: int) -> None:
    torch.manual_seed(0)
    callback = PerfCallback(output_dir=output_dir, console=False,
                            schedule=perfhooks.Schedule(skip_first=steps // 2, warmup=1, active=2))
    precision = "bf16-mixed" if optimized and torch.cuda.is_available() else "32-true"
    # Lightning's defaults stay on (its logger, checkpoints, progress bar), with a validation pass at the end:
    # perfhooks times validation and checkpoint writes apart from the steps it compares
    trainer = L.Trainer(max_steps=steps, accelerator="auto", devices=1, default_root_dir=str(output_dir),
                        precision=precision, limit_val_batches=2, callbacks=[callback])
    trainer.fit(lightning_module(d_model, max(1, d_model // 64), optimized=optimized),
                make_dataloader(steps, batch_size, seq_len, d_model), make_dataloader(2, batch_size, seq_len, d_model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="perfhooks_out/tutorial", help="baseline/ and optimized/ go here")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args(argv)
    root = Path(args.output_dir)
    for name, optimized in (("baseline", False), ("optimized", True)):
        train(root / name, optimized, args.steps, args.d_model, args.batch_size, args.seq_len)
    print(format_text(compare(load_side(root / "baseline"), load_side(root / "optimized"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
