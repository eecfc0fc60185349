"""Data movement: memcpy direction and pageable vs pinned; communication and its overlap with compute."""

from __future__ import annotations

from typing import Any

import numpy as np

from perfhooks.analysis import spans
from perfhooks.analysis.overview import communication_kernels, role_spans
from perfhooks.analysis.trace import Trace

DIRECTIONS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")


def memcpy_summary(trace: Trace, steps: int) -> dict[str, Any]:
    """Per direction: count, bytes and µs per step; plus the pageable share of host-device copies."""
    copies = trace.columns("memcpys")
    directions = [next((d for d in DIRECTIONS if d in (name or "")), "other") for name in copies.names]
    direction = np.asarray([*map(list(dict.fromkeys(directions)).index, directions)] or [0], dtype=np.int64)
    direction = direction[copies.name]
    table = list(dict.fromkeys(directions))
    moved = np.nan_to_num(copies.argument("bytes"))  # a copy that does not say its bytes moved none
    by_direction: dict[str, list[float]] = {}
    present, first = np.unique(direction, return_index=True)
    counts = np.bincount(direction, minlength=len(table))
    sizes = np.bincount(direction, weights=moved, minlength=len(table))
    times = np.bincount(direction, weights=copies.dur, minlength=len(table))
    for code in present[np.argsort(first, kind="stable")].tolist():
        by_direction[table[code]] = [int(counts[code]), float(sizes[code]), float(times[code])]
    host_device = np.isin(direction, [table.index(d) for d in ("HtoD", "DtoH") if d in table])
    pageable = host_device & copies.name_mask(lambda name: "Pageable" in (name or ""))
    host_device_us, pageable_us = float(copies.dur[host_device].sum()), float(copies.dur[pageable].sum())
    per_step = max(steps, 1)
    return {
        "by_direction": {
            d: {"count_per_step": n / per_step, "bytes_per_step": b / per_step, "us_per_step": t / per_step}
            for d, (n, b, t) in sorted(by_direction.items())},
        "pageable_share": pageable_us / host_device_us if host_device_us else 0.0,
        "pageable_us_per_step": pageable_us / per_step,
    }


def communication_summary(trace: Trace, window: list[spans.Span]) -> dict[str, Any]:
    """Communication kernel time as a share of step time, and the fraction of it hidden under compute."""
    length = spans.total(window)
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
