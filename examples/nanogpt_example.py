"""A small GPT in the style of nanoGPT, trained by a hand-written loop with perfhooks (accelerate ``attach``).

    python examples/nanogpt_example.py                      # CPU here (about a minute), CUDA where present
    python examples/nanogpt_example.py --steps 200 --n-layer 6 --n-embd 384 --output-dir runs/nanogpt

Causal self-attention goes through ``scaled_dot_product_attention`` (flash kernels on CUDA under bf16);
on CUDA the model is ``torch.compile``d and the forward runs under bf16 autocast. On CPU it stays eager in
FP32 unless ``--compile BACKEND`` asks (``aot_eager`` compiles in seconds; ``inductor`` takes longer than this
example's whole run). The report's ``run.compiling_s`` then says what compilation cost. Under Nsight Systems,
with perfhooks' windows bracketing the capture:

    nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop \\
        python examples/nanogpt_example.py --nsys
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import perfhooks
from perfhooks.integrations.accelerate import attach


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, length, width))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as nanoGPT
        for module in self.modules():  # nanoGPT's initialization: N(0, 0.02), zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.wte(idx) + self.wpe(positions))
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class RandomText(Dataset):
    """Sequences of random tokens (nothing downloaded); the target is the input shifted by one."""

    def __init__(self, samples: int, block_size: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab_size, (samples, block_size + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.data[index]
        return row[:-1], row[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--output-dir", default="perfhooks_out/nanogpt")
    parser.add_argument("--nsys", action="store_true", help="bracket the windows for nsys --capture-range")
    parser.add_argument("--compile", metavar="BACKEND", default=None,
                        help="torch.compile the model with this backend (default: inductor on CUDA, eager on CPU)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    accelerator = Accelerator(mixed_precision="bf16" if cuda else "no", cpu=not cuda)
    model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    loader = DataLoader(RandomText(args.steps * args.batch_size, args.block_size, args.vocab_size),
                        batch_size=args.batch_size, shuffle=True, pin_memory=cuda)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    backend = args.compile or ("inductor" if cuda else None)
    if backend:
        model = torch.compile(model, backend=backend)
    schedule = perfhooks.Schedule(skip_first=min(10, args.steps // 2), warmup=2, active=3)
    with attach(accelerator, output_dir=args.output_dir, schedule=schedule, nsys_capture=args.nsys and cuda):
        model.train()
        for step, (idx, targets) in enumerate(loader):
            loss = model(idx, targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 20 == 0:
                accelerator.print(f"step {step}: loss {loss.item():.3f} (ln vocab {math.log(args.vocab_size):.3f})")
    accelerator.print(f"report: {Path(args.output_dir) / 'report.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
