"""nanoGPT's ``train.py`` loop, with the lines perfhooks needs (each marked ``# perfhooks``).

The loop is nanoGPT's own shape: ``get_batch`` slices random windows out of one long token array (no DataLoader),
gradient accumulation over micro-steps, a ``GradScaler`` (enabled for float16 only), gradient clipping,
``estimate_loss`` under ``torch.no_grad()`` every ``eval_interval`` iterations, and a checkpoint after it. The model
is the small GPT of ``nanogpt_example.py``; the tokens are random, so nothing is downloaded.

    python examples/nanogpt_train.py --max-iters 40 --output-dir perfhooks_out/nanogpt_train
"""

from __future__ import annotations

import argparse
import os
from contextlib import nullcontext
from pathlib import Path

import torch

import perfhooks  # perfhooks
from nanogpt_example import GPT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-iters", type=int, default=40)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--eval-interval", type=int, default=20)
    parser.add_argument("--eval-iters", type=int, default=4)
    parser.add_argument("--output-dir", default="perfhooks_out/nanogpt_train")
    args = parser.parse_args(argv)

    torch.manual_seed(1337)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if device == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device == "cpu" else torch.autocast(device_type=device, dtype=ptdtype)
    vocab_size = 512
    data = {split: torch.randint(0, vocab_size, (20_000,), generator=torch.Generator().manual_seed(seed))
            for split, seed in (("train", 0), ("val", 1))}

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = data[split]
        ix = torch.randint(len(tokens) - args.block_size, (args.batch_size,))
        x = torch.stack([tokens[i:i + args.block_size] for i in ix])
        y = torch.stack([tokens[i + 1:i + 1 + args.block_size] for i in ix])
        return x.to(device), y.to(device)

    model = GPT(vocab_size, args.block_size, n_layer=2, n_head=4, n_embd=128).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler(device, enabled=(dtype == "float16"))

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = torch.zeros(args.eval_iters)
            for k in range(args.eval_iters):
                x, y = get_batch(split)
                with ctx:
                    losses[k] = model(x, y).item()
            out[split] = losses.mean().item()
        model.train()
        return out

    os.makedirs(args.output_dir, exist_ok=True)
    with perfhooks.profile(model, optimizer, output_dir=args.output_dir) as perf:  # perfhooks
        with perf.data_wait():  # perfhooks
            x, y = get_batch("train")
        for iter_num in range(args.max_iters):
            if iter_num % args.eval_interval == 0 and iter_num > 0:
                with perf.evaluation():  # perfhooks
                    losses = estimate_loss()
                print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                with perf.checkpoint():  # perfhooks
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "iter_num": iter_num}, os.path.join(args.output_dir, "ckpt.pt"))
            for _ in range(args.gradient_accumulation_steps):
                with ctx:
                    loss = model(x, y) / args.gradient_accumulation_steps
                with perf.data_wait():  # perfhooks
                    x, y = get_batch("train")  # nanoGPT prefetches the next batch while the GPU works
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    print(f"report: {Path(args.output_dir) / 'report.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
