"""Data movement: memcpy direction and pageable vs pinned; communication and its overlap with compute."""

from __future__ import annotations

from typing import Any

import numpy as np

from perfhooks.analysis import ranges, spans
from perfhooks.analysis.overview import communication_kernels, role_spans
from perfhooks.analysis.trace import Trace

DIRECTIONS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")


def memcpy_summary(trace: Trace, steps: int) -> dict[str, Any]:
    """Per direction: count, bytes and µs per step; plus the pageable share of host-device copies."""
    by_direction: dict[str, list[float]] = {}
    pageable_us = host_device_us = 0.0
    for copy in trace.memcpys:
        name = copy.name or ""
        direction = next((d for d in DIRECTIONS if d in name), "other")
        entry = by_direction.setdefault(direction, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += copy.a.bytes or 0
        entry[2] += copy.dur
        if direction in ("HtoD", "DtoH"):
            host_device_us += copy.dur
            if "Pageable" in name:
                pageable_us += copy.dur
    per_step = max(steps, 1)
    return {
        "by_direction": {
            d: {"count_per_step": n / per_step, "bytes_per_step": b / per_step, "us_per_step": t / per_step}
            for d, (n, b, t) in sorted(by_direction.items())},
        "pageable_share": pageable_us / host_device_us if host_device_us else 0.0,
        "pageable_us_per_step": pageable_us / per_step,
    }


def communication_summary(trace: Trace, window: list[ranges.Span]) -> dict[str, Any]:
    """Communication kernel time as a share of step time, and the fraction of it hidden under compute."""
    length = ranges.total(window)
    if not length:
        return {}
    roles = role_spans(trace)
    kernels = trace.columns("kernels")
    libraries = {"rccl" if "rccl" in (kernels.names[code] or "").lower() else "nccl"
                 for code in np.unique(kernels.name[communication_kernels(trace)]).tolist()}
    ops = trace.columns("cpu_ops")
    gloo = ops.take(ops.named(trace.names("cpu_ops", "gloo:"))) + [
        op for op in trace.annotations if (op.name or "").startswith("gloo:")]
    if gloo:
        libraries.add("gloo")
    comm = spans.union(spans.concat(roles["communication"], spans.of_events(gloo)))
    comm_time = spans.measure(comm, window)
    if not comm_time:
        return {"share": 0.0, "overlap": 0.0, "libraries": sorted(libraries)}
    compute = spans.union(roles["kernel"])
    both = spans.measure(spans.union(spans.concat(comm, compute)), window)
    hidden = comm_time + spans.measure(compute, window) - both
    return {"share": comm_time / length, "overlap": hidden / comm_time, "libraries": sorted(libraries),
            "exposed_share": (comm_time - hidden) / length, "backward": _has_backward(trace)}


def _has_backward(trace: Trace) -> bool:
    """Whether the window ran autograd's backward (its engine's ``evaluate_function`` ops): without one, the
    collectives are not a gradient all-reduce (tensor or pipeline parallel forward, inference)."""
    return bool(trace.names("cpu_ops", "autograd::engine::evaluate_function"))
