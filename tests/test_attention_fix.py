"""``unfused_attention`` on attention written out by hand with a padding mask (issue 67, items 2 and 3): the most
it says the fix saves holds against what SDPA saves, measured in the same run, and the fix passes the mask as
``attn_mask`` (``is_causal`` would compute something else)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from torch import nn

import perfhooks
from perfhooks import Schedule


class Attention(nn.Module):
    """Multi-head self-attention with a padding mask, written out by hand or through SDPA."""

    def __init__(self, width: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, width = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        keep = mask[:, None, None, :].bool()  # [b, 1, 1, n]: True where a key is a real token
        if self.fused:
            y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(~keep, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, n, width))


class Net(nn.Module):
    """An embedding, two attention blocks and a head: the loss of a batch of token ids and its padding mask."""

    def __init__(self, width: int, fused: bool) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(100, width), nn.Linear(width, 1)
        self.layers = nn.ModuleList(Attention(width, 4, fused) for _ in range(2))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer(x, mask)
        return self.head(x).mean()


def model_and_data(fused: bool) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = Net(64, fused)
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(16):
        lengths = torch.randint(20, 160, (8,), generator=generator)
        mask = (torch.arange(160)[None, :] < lengths[:, None]).long()
        batches.append((torch.randint(0, 100, (8, 160), generator=generator) * mask, mask))
    return model, batches


def step(model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, mask: torch.Tensor) -> None:
    loss = model(ids, mask)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def grouped(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fix padding_waste names: samples of similar length batched together, each batch padded to its longest
    sample (not to the fixed width)."""
    ids = torch.cat([batch[0] for batch in batches])
    mask = torch.cat([batch[1] for batch in batches])
    order = mask.sum(dim=1).argsort()
    out = []
    for chunk in order.split(batches[0][0].shape[0]):
        longest = int(mask[chunk].sum(dim=1).max())
        out.append((ids[chunk, :longest], mask[chunk, :longest]))
    return out


def best_ms(fused: bool, per_batch: bool = False, repeats: int = 3) -> float:
    """A pass over the batches without perfhooks (ms), each batch's step taken ``repeats`` times in a row and its
    shortest kept (a busy machine only lengthens a step); ``per_batch``: the samples grouped by length and each
    batch padded to its longest (:func:`grouped`)."""
    model, batches = model_and_data(fused)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = grouped(batches) if per_batch else batches
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a second intra-op thread waits on a busy core in large ops more than in small ones
    try:
        for ids, mask in batches[:2]:
            step(model, optimizer, ids, mask)
        total = 0.0
        for ids, mask in batches:
            shortest = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                step(model, optimizer, ids, mask)
                shortest = min(shortest, time.perf_counter() - started)
            total += shortest
    finally:
        torch.set_num_threads(threads)
    return total * 1e3


def test_the_ceiling_holds_against_sdpa_and_the_fix_passes_the_mask(tmp_path: Path) -> None:
    model, batches = model_and_data(fused=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, wandb=False,
                           schedule=Schedule(skip_first=3, warmup=1, active=3)) as perf:
        for ids, mask in batches:
            with perf.data_wait():
                pass
            step(model, optimizer, ids, mask)
    report = json.loads((tmp_path / "report.json").read_text())
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "unfused_attention"]
    assert verdict["measured"]["masked"] and "attn_mask=keep" in verdict["recommendation"]
    assert "is_causal=True replaces it only when the mask is causal" in verdict["recommendation"]
    # the same steps by hand and through SDPA, in this run (on this 2-core machine SDPA saved 35-38%)
    saved = 1 - best_ms(fused=True) / best_ms(fused=False)
    assert verdict["estimated_gain"] >= saved, (verdict["estimated_gain"], saved, verdict["evidence"])


def test_the_padding_ceiling_holds_against_padding_per_batch(tmp_path: Path) -> None:
    """Samples padded to 160 tokens where real ones are 20 to 160 (about 45% padding): padding_waste's most holds
    against what its fix saves, measured in this run: samples grouped by length, each batch padded to its longest
    (attention's share of the step grows with the square of the length, which a linear figure missed: here it
    said at most 44% where grouping saved 54%, on a 2-core machine; the ceiling now reads 68-70%. With both cores
    busy the saving reads 62-64%: large steps lose more to a busy sibling core than small ones)."""
    model, batches = model_and_data(fused=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    dicts = [{"input_ids": ids, "attention_mask": mask} for ids, mask in batches]
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, wandb=False, schedule=None) as perf:
        for batch in perf.batches(dicts):
            step(model, optimizer, batch["input_ids"], batch["attention_mask"])
    report = json.loads((tmp_path / "report.json").read_text())
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "padding_waste"]
    assert verdict["measured"]["fixed_width"] and "every batch arrives 160 tokens wide" in verdict["evidence"]
    saved = 1 - best_ms(fused=False, per_batch=True) / best_ms(fused=False)
    assert verdict["estimated_gain"] >= saved, (verdict["estimated_gain"], saved, verdict["evidence"])
