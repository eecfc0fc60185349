"""``shape_churn``: the steps that meet a batch shape for the first time are slow (the allocator and kernel
selection on a GPU; a recompilation for a compiled model), and the same shape again is not. Exact figures from the
H100 pattern, then a real compiled loop on the CPU whose new padded lengths recompile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import perfhooks
from perfhooks.report.statistics import PhaseStatistics, StepTiming
from perfhooks.rules.live import diagnose_live


def test_new_shapes_slow_and_repeats_fast_is_shape_churn_not_variance() -> None:
    """HF, padded to each batch's longest, H100: a new padded length took 120-230 ms against a 28 ms p50."""
    stats = PhaseStatistics()
    lengths = [64, 64, 96, 64, 96, 128, 64, 128, 96, 160, 64, 160, 128, 192, 96, 192, 64, 160, 128, 96] * 2
    seen: set[int] = set()
    for index, length in enumerate(lengths):
        new = length not in seen
        seen.add(length)
        ms = 150.0 if new else 28.0
        stats.add(StepTiming(index, ms, {"forward": ms / 3, "backward": ms / 2}, 1, index, shape=length,
                             new_shape=new))
    ids = [d["id"] for d in diagnose_live(stats, framework="transformers")]
    assert "shape_churn" in ids and "step_time_variance" not in ids
    [verdict] = [d for d in diagnose_live(stats, framework="transformers") if d["id"] == "shape_churn"]
    assert verdict["measured"]["shapes"] == 5 and verdict["measured"]["new_shape_steps"] == 4  # the first is warm-up
    total = 4 * 150.0 + (len(lengths) - 5) * 28.0
    assert verdict["estimated_gain"] == pytest.approx(4 * (150.0 - 28.0) / total, abs=1e-4)
    assert "pad_to_multiple_of=64" in verdict["recommendation"]


def test_new_shapes_no_slower_than_repeats_are_not_churn() -> None:
    stats = PhaseStatistics()
    seen: set[int] = set()
    for index, length in enumerate([64, 96, 128, 160, 192, 64, 96, 128, 160, 192] * 3):
        new = length not in seen
        seen.add(length)
        ms = 20.0 + length / 10  # longer batches take longer, new or not
        stats.add(StepTiming(index, ms, {"forward": ms / 3}, 1, index, shape=length, new_shape=new))
    assert "shape_churn" not in [d["id"] for d in diagnose_live(stats)]


@pytest.mark.slow
def test_a_compiled_loop_whose_padded_lengths_are_new_gets_shape_churn(tmp_path: Path) -> None:
    """torch.compile(dynamic=False): each new padded length recompiles (aot_eager, CPU); its later steps do not."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    lengths = [16, 16, 16, 24, 16, 24, 24, 32, 16, 32, 24, 40, 32, 40, 16, 48, 40, 48, 24, 32] * 2
    with perfhooks.profile(compiled, optimizer, output_dir=tmp_path, console=False, schedule=None) as run:
        for length in lengths:
            with run.data_wait():
                ids = torch.randint(0, 512, (8, length))
            compiled(ids).float().logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    report = json.loads((tmp_path / "report.json").read_text())
    verdicts = {d["id"]: d for d in report["diagnoses"]}
    series = report["series"]
    assert "shape_churn" in verdicts, ([(d["id"], d["evidence"]) for d in report["diagnoses"]],
                                       {name: series.get(name) for name in ("forward", "other", "perfhooks")})
    churn = verdicts["shape_churn"]
    assert churn["measured"]["shapes"] == 5 and "pad_to_multiple_of" in churn["recommendation"]
    assert "recompiles" in churn["recommendation"]
    assert "step_time_variance" not in verdicts

