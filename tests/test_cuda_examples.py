"""On a GPU: the tutorial baseline gets fp32_matmul and unfused_attention where its kernels take their share of
the step; the optimized variant gets no warning of what it fixed (flash attention through SDPA, a larger batch,
bf16 autocast)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import train_steps
from perfhooks import Engine, PerfConfig, Schedule
from perfhooks.offline.analyze import analyze_paths

pytestmark = pytest.mark.cuda


def profile_tutorial(tmp_path: Path, optimized: bool) -> dict:
    from tutorial_transformer import OptimizedTransformerLayer, TransformerLayer

    torch.manual_seed(0)
    layer = (OptimizedTransformerLayer if optimized else TransformerLayer)().cuda()
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-4, fused=optimized)
    batch = 64 if optimized else 16
    x = torch.randn(batch, 128, 512, device="cuda")
    engine = Engine(PerfConfig(schedule=Schedule(skip_first=3, warmup=1, active=3), console=False,
                               analyze_windows=False), tmp_path, "test", device="cuda")
    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=optimized):
            return layer(batch).float().square().mean()

    train_steps(engine, loss_of, optimizer, [x] * 10)
    report = engine.close()
    return analyze_paths([report["windows"][0]["path"]])


def test_baseline_gets_fp32_matmul_and_unfused_attention_where_it_matters(tmp_path: Path) -> None:
    """The baseline's matmuls are seen in FP32 and its attention (``nn.MultiheadAttention`` with its weights: bmm
    and softmax) as written out; ``fp32_matmul`` and ``unfused_attention`` fire whenever those kernels take their
    threshold's share of the steady step. On an H100 the 16 x 128 tokens leave the step host-bound and both a small
    part of it: each verdict, once asserted unconditionally, then rightly stayed silent (2026-11-27, twice for the
    attention, once for the matmuls); on a small GPU both fire."""
    from perfhooks.rules.thresholds import Thresholds

    result = profile_tutorial(tmp_path, optimized=False)
    ids = {d["id"] for d in result["diagnoses"]}
    metrics = result["metrics"]
    step_us = (metrics.get("steady") or {}).get("step_us") or metrics["step_us"]
    steps = max(metrics.get("steps", 1), 1)
    precision = metrics["eligible_precision"]
    assert precision["fp32"] > 0 and precision["half"] == 0, precision
    fp32_share = precision["fp32"] / steps / step_us
    assert "fp32_matmul" in ids or fp32_share < Thresholds().fp32_eligible_share, (fp32_share, ids)
    attention = metrics["attention"]
    slow = attention.get("unfused", 0.0) + attention.get("math", 0.0)
    fast = sum(attention.get(kind, 0.0) for kind in ("flash", "memory_efficient", "cudnn"))
    assert slow > 0 and fast == 0, attention
    share = slow / steps / step_us
    assert ("unfused_attention" in ids) is (share >= Thresholds().unfused_attention_share), (share, ids)


#: What may rightly be said of the optimized layer on a fast GPU: on an H100 its 64 x 128 tokens leave the device
#: waiting on the host (the premise "no warning" held only on a small GPU).
HOST_BOUND_VERDICTS = {"low_gpu_utilization", "host_bound", "launch_bound"}


def test_optimized_gets_no_warning_of_what_it_fixed(tmp_path: Path) -> None:
    """The three fixes took: no fp32 matmul, no hand-written attention, flash or memory-efficient attention. A
    warning left is only one that the GPU's speed makes true of any small model (the host-bound ones)."""
    result = profile_tutorial(tmp_path, optimized=True)
    warned = {d["id"] for d in result["diagnoses"] if d["severity"] in ("warning", "critical")}
    assert not warned & {"fp32_matmul", "unfused_attention"}, warned
    assert warned <= HOST_BOUND_VERDICTS, warned
    assert result["metrics"]["attention"].get("flash", 0) + result["metrics"]["attention"].get(
        "memory_efficient", 0) > 0
