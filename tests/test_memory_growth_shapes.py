"""Growth that is a cache, not a leak (issue 67, item 5): with a different padded length per batch, per-shape caches
fill as new shapes arrive and hold on repeats. ``memory_growth`` counts only the growth between samples that saw no
new batch shape; a real leak still fires, with or without new shapes beside it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import perfhooks
from perfhooks.rules.memory import diagnose_memory_growth

MIB = 2**20
LIMIT = 8 * 2**30


def samples(count: int, per_shape_mib: float, per_step_mib: float, new_shape_every: int) -> list[tuple[int, ...]]:
    """``(step, bytes, shapes seen)`` every 5 steps: each new shape adds ``per_shape_mib`` (a cache entry), each
    step ``per_step_mib`` (a leak); a new shape arrives every ``new_shape_every`` samples (0: never)."""
    out, used, shapes = [], 1 << 30, 1
    for index in range(count):
        if new_shape_every and index % new_shape_every == 0:
            shapes += 1
            used += int(per_shape_mib * MIB)
        used += int(5 * per_step_mib * MIB)
        out.append((5 * index, used, shapes))
    return out


def test_growth_only_with_new_shapes_is_their_caches_not_a_leak() -> None:
    """The issue's runs: padded lengths that vary per batch; memory rises 20 MiB with each of the first shapes and
    holds on repeats. Before, the stair read as a straight line (R² 0.97) and 'something is kept from every step'."""
    stair = samples(60, per_shape_mib=20, per_step_mib=0, new_shape_every=2)
    assert diagnose_memory_growth(stair, LIMIT, "resident") == []
    without_shapes = [(step, used) for step, used, _ in stair]
    assert [d["id"] for d in diagnose_memory_growth(without_shapes, LIMIT, "resident")] == ["memory_growth"], \
        "the same bytes without the shapes: the old reading, which this guards against"


def test_a_leak_beside_new_shapes_still_fires_and_says_what_it_counted() -> None:
    leak = samples(60, per_shape_mib=20, per_step_mib=1.0, new_shape_every=2)
    (verdict,) = diagnose_memory_growth(leak, LIMIT, "resident")
    assert verdict["id"] == "memory_growth"
    assert verdict["measured"]["growth_mib_per_step"] == pytest.approx(1.0, rel=0.01)
    assert verdict["measured"]["new_shapes"] == 14
    assert "counted only between the 15 samples that saw no new batch shape" in verdict["evidence"]


def test_a_leak_on_fixed_shapes_fires_as_before() -> None:
    leak = samples(40, per_shape_mib=0, per_step_mib=1.0, new_shape_every=0)
    (verdict,) = diagnose_memory_growth(leak, LIMIT, "allocated")
    assert verdict["measured"]["new_shapes"] == 0 and "new batch shape" not in verdict["evidence"]
    assert verdict["measured"]["growth_mib_per_step"] == pytest.approx(1.0, rel=0.01)


def test_shapes_that_never_repeat_leave_too_little_to_judge() -> None:
    """A new shape at every sample: no interval without one, so no claim either way (prefer silence)."""
    assert diagnose_memory_growth(samples(40, per_shape_mib=0, per_step_mib=1.0, new_shape_every=1), LIMIT,
                                  "resident") == []


def test_each_step_start_sample_carries_the_shapes_seen_by_then(tmp_path: Path) -> None:
    """A plain loop whose batches come in four padded lengths: the samples' shape counts rise to four and hold."""
    model = torch.nn.Embedding(100, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    lengths = [16, 32, 48, 64]
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, schedule=None, memory_poll_s=0.0,
                           overhead_budget=None) as run:
        for step in range(40):
            with run.data_wait():
                batch = torch.randint(0, 100, (4, lengths[min(step // 5, 3)]))
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        shapes = [sample[2] for sample in run.engine.memory.step_samples]
    assert shapes[0] <= 1 and shapes[-1] == 4
    assert shapes == sorted(shapes)
