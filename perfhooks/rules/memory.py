"""Memory verdicts: near the limit, a fragmented allocator, activations dominating, and memory that grows (bytes in
use at the same point of each step, rising on a sustained linear trend); the fixes an OOM dump suggests."""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import Diagnosis, make

MIB = 2**20
#: Fewest samples after warm-up that a trend is fitted on.
MIN_SAMPLES = 8


def linear_fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares slope (bytes per step) and R² (0..1) of ``(step, bytes)`` points."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    if sxx == 0:
        return 0.0, 0.0
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return slope, r2


def diagnose_memory_growth(samples: list[tuple[int, ...]], limit_bytes: int | None, what: str,
                           t: Thresholds = Thresholds()) -> list[Diagnosis]:
    """``memory_growth`` when the bytes in use at each step's start (``samples``: ``(step, bytes)``, or
    ``(step, bytes, shapes)`` with the distinct batch shapes seen by then) keep rising.

    The first half of the samples is warm-up (caches filling, the optimizer's state appearing) and is not fitted.
    The rest must rise on a straight line (R² >= ``memory_growth_r2``) by at least ``memory_growth_bytes`` or
    ``memory_growth_share`` of the limit, whichever is smaller: a plateau, or noise around one, never fires.
    Where new batch shapes arrived in that span, only the growth between samples that saw no new shape counts:
    per-shape caches (the allocator's blocks, oneDNN's and cuDNN's plans) fill as shapes arrive and hold on
    repeats, which is ``shape_churn``'s business, not something kept from every step.
    ``what``: ``allocated`` (CUDA) or ``resident`` (CPU).
    """
    steady = samples[len(samples) // 2:]
    if len(steady) < MIN_SAMPLES or not limit_bytes:
        return []
    points = [(sample[0], sample[1]) for sample in steady]
    shapes = [sample[2] for sample in steady] if all(len(sample) > 2 for sample in steady) else None
    new_shapes = shapes[-1] - shapes[0] if shapes is not None else 0
    repeats = len(points) - 1
    if new_shapes > 0:  # the growth on repeated shapes only: the intervals with no new shape, end to end
        x = y = 0
        points = [(0, 0)]
        for before, after in itertools.pairwise(steady):
            if after[2] == before[2]:
                x += after[0] - before[0]
                y += after[1] - before[1]
                points.append((x, y))
        repeats = len(points) - 1
        if repeats < MIN_SAMPLES:  # too few intervals without a new shape to tell a leak from the shapes' caches
            return []
    slope, r2 = linear_fit(points)
    first_step, last_step = steady[0][0], steady[-1][0]
    growth = slope * (points[-1][0] - points[0][0])
    needed = min(t.memory_growth_bytes, t.memory_growth_share * limit_bytes)
    if slope <= 0 or r2 < t.memory_growth_r2 or growth < needed:
        return []
    now = steady[-1][1]
    fill_step = last_step + max(0.0, limit_bytes - now) / slope
    per_step_mib = slope / MIB
    on_repeats = (f"; counted only between the {repeats} samples that saw no new batch shape ({new_shapes} new "
                  f"shape(s) arrived in that span, whose growth is the shapes' own)") if new_shapes > 0 else ""
    return [make(
        "memory_growth", "warning", "Memory in use grows every step",
        f"{what} memory at the start of each step rises {per_step_mib:.2f} MiB per step (R² {r2:.2f}, steps "
        f"{first_step}-{last_step}, +{growth / MIB:.0f} MiB after warm-up{on_repeats}); at this rate the limit of "
        f"{limit_bytes / 2**30:.2f} GiB is reached near step {fill_step:.0f}. Thresholds: R² {t.memory_growth_r2}, "
        f"growth {needed / MIB:.0f} MiB",
        0.0,
        "Something is kept from every step. Usual causes: a loss or output kept with its graph (accumulate "
        "loss.item() or loss.detach(), not loss), a list that collects tensors each step, a cache keyed by step. "
        "Record the allocation history (memory_history=True) and read the stacks of the allocations that "
        "stay alive in the capture's snapshot.",
        growth_mib_per_step=per_step_mib, r2=r2, fill_step=fill_step, first_step=first_step, last_step=last_step,
        new_shapes=new_shapes)]


class MemoryFigures(NamedTuple):
    """What the memory verdicts read, copied out of the monitor on the training thread (never mutated after)."""

    #: ``(step, bytes in use, distinct batch shapes seen by then)`` at steps' starts (the shapes -1: not counted).
    step_samples: tuple[tuple[int, ...], ...]
    #: The limit the used bytes count against (bytes), or None when unknown.
    capacity_bytes: int | None
    #: True on CUDA (allocated bytes are sampled), False on the CPU (resident bytes).
    cuda: bool
    #: ``{used_bytes, step, phase}`` of the highest sample.
    peak: dict[str, Any]
    #: The latest sample's figures (``reserved_bytes``, ``allocated_bytes``, ``num_alloc_retries``, ...).
    latest: dict[str, Any]
    #: The latest live-tensor census (``total_bytes``, ``activations_other_bytes``, ...), if one was taken.
    census: dict[str, Any] | None


def diagnose_memory(figures: MemoryFigures, t: Thresholds = Thresholds()) -> list[Diagnosis]:
    """Memory verdicts: memory growing every step, near the limit, fragmentation, activations dominating."""
    out = diagnose_memory_growth(list(figures.step_samples), figures.capacity_bytes,
                                 "allocated" if figures.cuda else "resident", t)
    for check in (_near_limit, _fragmented, _activations_dominate):
        verdict = check(figures, t)
        if verdict is not None:
            out.append(verdict)
    return out


def _near_limit(figures: MemoryFigures, t: Thresholds) -> Diagnosis | None:
    used, capacity, peak = figures.peak["used_bytes"], figures.capacity_bytes, figures.peak
    if not capacity or used / capacity < t.memory_fraction:
        return None
    return make(
        "memory_near_limit", "warning", "Memory use came close to the limit",
        f"peak {used / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB ({used / capacity:.0%}) at "
        f"step {peak['step']} in {peak['phase']}; threshold {t.memory_fraction:.0%}",
        0.0, " ".join(oom_recommendations(figures.census, figures.latest)[:2]),
        used_fraction=used / capacity)


def _fragmented(figures: MemoryFigures, _t: Thresholds) -> Diagnosis | None:
    latest = figures.latest
    reserved, allocated = latest.get("reserved_bytes", 0), latest.get("allocated_bytes", 0)
    if not (allocated and reserved / allocated > 1.5 and latest.get("num_alloc_retries", 0) > 0):
        return None
    return make(
        "memory_fragmentation", "warning", "The caching allocator is fragmented",
        f"reserved/allocated {reserved / allocated:.2f} with {latest['num_alloc_retries']} allocator "
        "retries; thresholds 1.5 and 0", 0.0,
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and avoid tensors whose size changes "
        "every step.", reserved_over_allocated=reserved / allocated)


def _activations_dominate(figures: MemoryFigures, _t: Thresholds) -> Diagnosis | None:
    census = figures.census
    if not (census and census.get("total_bytes") and census["activations_other_bytes"] > census["total_bytes"] / 2):
        return None
    share = census["activations_other_bytes"] / census["total_bytes"]
    return make(
        "activations_dominate", "info", "Activations hold most of the memory",
        f"activations and other tensors are {share:.0%} of live tensor bytes; threshold 50%", 0.0,
        "Activation checkpointing trades recompute for memory: torch.utils.checkpoint.checkpoint(block, x, "
        "use_reentrant=False).", activations_share=share)


def oom_recommendations(census: dict[str, Any] | None, memory: dict[str, Any]) -> list[str]:
    """The fixes for memory at or near the limit, in the order the evidence suggests."""
    fixes = {
        "batch": "Lower the per-device batch size (keep the global batch with gradient accumulation).",
        "checkpointing": "Recompute activations in backward: torch.utils.checkpoint.checkpoint(block, x, "
                         "use_reentrant=False) per block (HF: model.gradient_checkpointing_enable()).",
        "bf16": "Train in bf16: with torch.autocast(\"cuda\", dtype=torch.bfloat16): ... (Lightning: "
                "precision=\"bf16-mixed\"; HF: bf16=True); it halves activation memory.",
        "expandable": "Reduce fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    }
    order = ["batch", "checkpointing", "bf16"]
    if census:
        total = census.get("total_bytes") or 1
        if census.get("activations_other_bytes", 0) > total / 2:
            order = ["checkpointing", "batch", "bf16"]
        elif census.get("parameters_bytes", 0) + census.get("optimizer_state_bytes", 0) > total / 2:
            order = ["bf16", "batch", "checkpointing"]
    reserved, allocated = memory.get("reserved_bytes") or 0, memory.get("allocated_bytes") or 0
    if allocated and reserved / allocated > 1.5 and memory.get("num_alloc_retries", 0) > 0:
        order.insert(0, "expandable")
    return [fixes[key] for key in order]
