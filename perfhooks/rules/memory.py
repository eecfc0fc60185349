"""Memory that grows: bytes in use at the same point of each step, rising on a sustained linear trend."""

from __future__ import annotations

from typing import Any

from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import make

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


def diagnose_memory_growth(samples: list[tuple[int, int]], limit_bytes: int | None, what: str,
                           t: Thresholds = Thresholds()) -> list[dict[str, Any]]:
    """``memory_growth`` when the bytes in use at each step's start (``samples``: ``(step, bytes)``) keep rising.

    The first half of the samples is warm-up (caches filling, the optimizer's state appearing) and is not fitted.
    The rest must rise on a straight line (R² >= ``memory_growth_r2``) by at least ``memory_growth_bytes`` or
    ``memory_growth_share`` of the limit, whichever is smaller: a plateau, or noise around one, never fires.
    ``what``: ``allocated`` (CUDA) or ``resident`` (CPU).
    """
    steady = samples[len(samples) // 2:]
    if len(steady) < MIN_SAMPLES or not limit_bytes:
        return []
    slope, r2 = linear_fit(steady)
    first_step, last_step = steady[0][0], steady[-1][0]
    growth = slope * (last_step - first_step)
    needed = min(t.memory_growth_bytes, t.memory_growth_share * limit_bytes)
    if slope <= 0 or r2 < t.memory_growth_r2 or growth < needed:
        return []
    now = steady[-1][1]
    fill_step = last_step + max(0.0, limit_bytes - now) / slope
    per_step_mib = slope / MIB
    return [make(
        "memory_growth", "warning", "Memory in use grows every step",
        f"{what} memory at the start of each step rises {per_step_mib:.2f} MiB per step (R² {r2:.2f}, steps "
        f"{first_step}-{last_step}, +{growth / MIB:.0f} MiB after warm-up); at this rate the limit of "
        f"{limit_bytes / 2**30:.2f} GiB is reached near step {fill_step:.0f}. Thresholds: R² {t.memory_growth_r2}, "
        f"growth {needed / MIB:.0f} MiB",
        0.0,
        "Something is kept from every step. Usual causes: a loss or output kept with its graph (accumulate "
        "loss.item() or loss.detach(), not loss), a list that collects tensors each step, a cache keyed by step or "
        "by shape. Record the allocation history (memory_history=True) and read the stacks of the allocations that "
        "stay alive in the capture's snapshot.",
        growth_mib_per_step=per_step_mib, r2=r2, fill_step=fill_step, first_step=first_step, last_step=last_step)]
