"""HTA-style views of device time: idle / compute / non-compute, and why the GPU sat idle."""

from __future__ import annotations

import numpy as np

from perfhooks.analysis import spans
from perfhooks.analysis.kernels import launch_times
from perfhooks.analysis.overview import role_spans
from perfhooks.analysis.trace import Trace

#: An idle gap no longer than this (µs) while the next kernel was already launched is "kernel wait".
KERNEL_WAIT_MAX_US = 50.0


def temporal_breakdown(trace: Trace, window: list[spans.Span]) -> dict[str, float]:
    """Fractions 0..1 of the steps' time: ``idle``, ``compute`` (compute kernels), ``non_compute``
    (communication kernels, memcpy, memset), each counted once (compute first)."""
    length = spans.total(window)
    if not length or not trace.has_gpu:
        return {}
    roles = role_spans(trace)
    compute = spans.union(roles["kernel"])
    busy = spans.union(spans.concat(compute, roles["communication"], roles["memcpy"], roles["memset"]))
    compute_time = spans.measure(compute, window)
    busy_time = spans.measure(busy, window)
    return {"idle": 1 - busy_time / length, "compute": compute_time / length,
            "non_compute": (busy_time - compute_time) / length}


def idle_breakdown(trace: Trace, window: list[spans.Span]) -> dict[str, float]:
    """The GPU's idle time inside the steps, split (fractions 0..1 of idle time) into:

    - ``host_wait``: the next device activity had not been launched yet when the GPU went idle;
    - ``kernel_wait``: it had, and the gap was at most ``KERNEL_WAIT_MAX_US`` (launch latency, dependencies);
    - ``other``: longer gaps with work already queued (synchronization, events, other streams).
    """
    device = trace.columns("device_events")
    if not len(device) or not window:
        return {}
    # each gap: from the end of all the work before an event (the latest end so far) to its start
    busy_until = np.maximum.accumulate(device.end)[:-1]
    starts = device.ts[1:]
    gaps = np.flatnonzero(starts > busy_until)
    low, high = busy_until[gaps], starts[gaps]
    gap = _inside(high, window) - _inside(low, window)
    counted = gap > 0
    gaps, low, gap = gaps[counted], low[counted], gap[counted]
    launched = launch_times(trace, device.correlation[gaps + 1])
    host_wait = launched >= low  # NaN (no launch recorded) compares False
    kernel_wait = ~host_wait & (gap <= KERNEL_WAIT_MAX_US)
    host, kernel = float(gap[host_wait].sum()), float(gap[kernel_wait].sum())
    other = float(gap[~host_wait & ~kernel_wait].sum())
    idle = host + kernel + other
    if not idle:
        return {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0, "idle_us": 0.0}
    return {"host_wait": host / idle, "kernel_wait": kernel / idle, "other": other / idle, "idle_us": idle}


def _inside(times: np.ndarray, window: list[spans.Span]) -> np.ndarray:
    """For each time, how much of the (sorted, disjoint) window lies before it (µs)."""
    lows = np.fromiter((low for low, _ in window), dtype=np.float64, count=len(window))
    highs = np.fromiter((high for _, high in window), dtype=np.float64, count=len(window))
    before = np.concatenate(([0.0], np.cumsum(highs - lows)))
    index = np.searchsorted(lows, times, side="right") - 1
    clipped = np.clip(times - lows[np.maximum(index, 0)], 0.0, (highs - lows)[np.maximum(index, 0)])
    return np.where(index >= 0, before[np.maximum(index, 0)] + clipped, 0.0)
