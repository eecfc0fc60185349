"""HTA-style views of device time: idle / compute / non-compute, and why the GPU sat idle."""

from __future__ import annotations

from perfhooks.analysis import ranges, spans
from perfhooks.analysis.overview import role_spans
from perfhooks.analysis.trace import Trace

#: An idle gap no longer than this (µs) while the next kernel was already launched is "kernel wait".
KERNEL_WAIT_MAX_US = 50.0


def temporal_breakdown(trace: Trace, window: list[ranges.Span]) -> dict[str, float]:
    """Fractions 0..1 of the steps' time: ``idle``, ``compute`` (compute kernels), ``non_compute``
    (communication kernels, memcpy, memset), each counted once (compute first)."""
    length = ranges.total(window)
    if not length or not trace.has_gpu:
        return {}
    roles = role_spans(trace)
    compute = spans.union(roles["kernel"])
    busy = spans.union(spans.concat(compute, roles["communication"], roles["memcpy"], roles["memset"]))
    compute_time = spans.measure(compute, window)
    busy_time = spans.measure(busy, window)
    return {"idle": 1 - busy_time / length, "compute": compute_time / length,
            "non_compute": (busy_time - compute_time) / length}


def idle_breakdown(trace: Trace, window: list[ranges.Span]) -> dict[str, float]:
    """The GPU's idle time inside the steps, split (fractions 0..1 of idle time) into:

    - ``host_wait``: the next device activity had not been launched yet when the GPU went idle;
    - ``kernel_wait``: it had, and the gap was at most ``KERNEL_WAIT_MAX_US`` (launch latency, dependencies);
    - ``other``: longer gaps with work already queued (synchronization, events, other streams).
    """
    launches = trace.launch_ts
    device = trace.device_events
    if not device or not window:
        return {}
    w = 0  # gaps come in time order: walk the window once
    host = kernel = other = 0.0
    busy_until = device[0].ts + device[0].dur
    for event in device[1:]:
        start = event.ts
        if start > busy_until:
            while w < len(window) and window[w][1] <= busy_until:
                w += 1
            gap = 0.0
            k = w
            while k < len(window) and window[k][0] < start:
                gap += min(start, window[k][1]) - max(busy_until, window[k][0])
                k += 1
            if gap > 0:
                launched = launches.get(event.correlation)
                if launched is not None and launched >= busy_until:
                    host += gap
                elif gap <= KERNEL_WAIT_MAX_US:
                    kernel += gap
                else:
                    other += gap
        busy_until = max(busy_until, start + event.dur)
    idle = host + kernel + other
    if not idle:
        return {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0, "idle_us": 0.0}
    return {"host_wait": host / idle, "kernel_wait": kernel / idle, "other": other / idle, "idle_us": idle}
