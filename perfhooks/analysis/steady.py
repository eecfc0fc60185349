"""What in a window is not the steady state, so that the steady-state rules are judged without it.

- **One-time start-up work** (:func:`perfhooks.analysis.kernels.startup_calls`): modules loaded at a kernel's first
  launch, streams, events and the allocator set up.
- **CUDA/HIP graph captures**: between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` the launches are
  recorded into a graph and run nothing, so the device looks idle while the host is busy.
- **Work queued behind what the trace did not record**: the host launched everything early, and the device ran
  it back to back much later (behind work before the profiler started, or with a clock offset); the time before
  the first kernel is queueing, not idle time.
"""

from __future__ import annotations

import statistics
from typing import Any

from perfhooks.analysis import ranges, spans
from perfhooks.analysis.kernels import startup_calls
from perfhooks.analysis.trace import Event, Trace

#: Runtime calls that open and close a stream capture (CUDA and HIP).
BEGIN_CAPTURE = ("cudaStreamBeginCapture", "hipStreamBeginCapture")
END_CAPTURE = ("cudaStreamEndCapture", "hipStreamEndCapture")
#: Below this fraction 0..1 of the window left for the steady state, no steady-state utilization is judged.
MIN_STEADY_SHARE = 0.05
#: Queueing is read only when the device ran this busy (fraction 0..1) from its first kernel to its last ...
QUEUED_BUSY = 0.90
#: ... and the time before its first kernel was at least this fraction of the window's idle time.
QUEUED_LEAD_OF_IDLE = 0.50


def graph_captures(trace: Trace) -> list[ranges.Span]:
    """Each stream capture's span (begin call's start to end call's end, µs), paired per host thread."""
    open_at: dict[Any, float] = {}
    out: list[ranges.Span] = []
    for call in sorted((c for c in trace.runtimes if (c.name or "").startswith(BEGIN_CAPTURE + END_CAPTURE)),
                       key=lambda c: c.ts):
        thread = (call.pid, call.tid)
        if (call.name or "").startswith(BEGIN_CAPTURE):
            open_at.setdefault(thread, call.ts)
        elif thread in open_at:
            out.append((open_at.pop(thread), call.ts + call.dur))
    return ranges.merge(out)


def steady_state(trace: Trace, window: list[ranges.Span], steps: int, device: int | None) -> dict[str, Any]:
    """The window less start-up work and graph captures: ``{excluded_us, excluded_share, captures, capture_us,
    step_us, gpu_utilization}`` (µs per step; utilization 0..1 of the steady time, ``None`` when less than
    :data:`MIN_STEADY_SHARE` of the window is left). Empty when nothing is excluded."""
    length = ranges.total(window)
    if not length or steps <= 0:
        return {}
    captures = [(max(s, lo), min(e, hi)) for s, e in graph_captures(trace) for lo, hi in window if s < hi and e > lo]
    startup = [(c.ts, c.ts + c.dur) for c in startup_calls(trace)]
    holes = ranges.merge([(s, e) for s, e in startup if e > s] + captures)
    steady = ranges.subtract(window, holes)
    steady_us = ranges.total(steady)
    excluded = length - steady_us
    if excluded <= 0:
        return {}
    utilization = None
    if device is not None and steady_us >= MIN_STEADY_SHARE * length:
        kernels = [k for k in trace.kernels if k.device == device]
        utilization = spans.measure(spans.union(spans.of_events(kernels)), steady) / steady_us
    return {"excluded_us": excluded, "excluded_share": excluded / length, "captures": len(captures),
            "capture_us": ranges.total(captures), "step_us": steady_us / steps, "gpu_utilization": utilization}


def device_queueing(trace: Trace, window: list[ranges.Span], device: int | None) -> dict[str, Any]:
    """Device work that queued behind work the trace did not record: the device busy at least
    :data:`QUEUED_BUSY` from its first kernel to its last, most of the window's idle time before the first kernel,
    and kernels starting a median of at least half that lead after their launch. ``{lead_us, busy_share,
    median_launch_to_start_us}``; empty when the pattern is not there."""
    if device is None or not window:
        return {}
    low, high = window[0][0], window[-1][1]
    kernels = [k for k in trace.kernels if k.device == device and low <= k.ts < high]
    if not kernels:
        return {}
    first = min(k.ts for k in kernels)
    lead = sum(max(0.0, min(end, first) - start) for start, end in window)
    busy_spans = spans.union(spans.of_events(kernels))
    idle = ranges.total(window) - spans.measure(busy_spans, window)
    if not idle or lead < QUEUED_LEAD_OF_IDLE * idle:  # the common case, decided before the costlier figures
        return {}
    last = max(k.ts + k.dur for k in kernels)
    busy = spans.measure(busy_spans, [(first, last)])
    gaps = _launch_gaps(trace, kernels)
    if last <= first or not gaps:
        return {}
    median_gap = statistics.median(gaps)
    if busy / (last - first) < QUEUED_BUSY or median_gap < QUEUED_LEAD_OF_IDLE * lead:
        return {}
    return {"lead_us": lead, "busy_share": busy / (last - first), "median_launch_to_start_us": median_gap}


def _launch_gaps(trace: Trace, kernels: list[Event]) -> list[float]:
    launches = trace.launch_ts
    return [k.ts - launches[k.correlation] for k in kernels if k.correlation in launches]

