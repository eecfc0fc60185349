"""Operators by the device time of the kernels they launched themselves, with input shapes."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from perfhooks.analysis import spans
from perfhooks.analysis.columns import ABSENT
from perfhooks.analysis.trace import Trace

#: Ops whose math Tensor Cores can run (GEMMs and convolutions, attention).
TENSOR_CORE_ELIGIBLE = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::conv", "aten::cudnn_convolution", "aten::convolution", "aten::_convolution",
                        "aten::_scaled_dot_product", "aten::einsum", "aten::_scaled_mm")
FP32_TYPES = ("float", "Float", "float32")
HALF_TYPES = ("c10::Half", "c10::BFloat16", "Half", "BFloat16")


def _device_time_columns(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The external ids that launched device work (sorted), and each one's device µs (summed in time order)."""
    cached = trace.__dict__.get("_device_time_columns")
    if cached is None:
        device = trace.columns("device_events")
        has_id = device.external_id != ABSENT
        ids, inverse = np.unique(device.external_id[has_id], return_inverse=True)
        totals = np.bincount(inverse, weights=device.dur[has_id], minlength=ids.size)
        cached = trace.__dict__["_device_time_columns"] = (ids, totals)
    return cached


def op_device_time(trace: Trace) -> np.ndarray:
    """Each operator's (row of ``trace.columns("cpu_ops")``) device µs: the kernels it launched itself."""
    cached = trace.__dict__.get("_op_device_time")
    if cached is None:
        ids, totals = _device_time_columns(trace)
        external = trace.columns("cpu_ops").external_id
        cached = np.zeros(external.size)
        if ids.size:
            slot = np.minimum(np.searchsorted(ids, external), ids.size - 1)
            found = ids[slot] == external
            cached[found] = totals[slot[found]]
        trace.__dict__["_op_device_time"] = cached
    return cached


def device_time_inside(trace: Trace, ops: list[Any]) -> float:
    """Device µs of everything launched inside ``ops`` (a launch on the op's own thread between its start and its
    end: the op's own kernels and its children's); nested ops are counted once."""
    cached = trace.__dict__.get("_launches_by_thread")
    if cached is None:
        device: dict[Any, float] = {}
        for event in trace.device_events:
            if event.correlation is not None:
                device[event.correlation] = device.get(event.correlation, 0.0) + event.dur
        by_thread: dict[Any, list[tuple[float, float]]] = {}
        for call in trace.runtimes:
            if call.correlation in device:
                by_thread.setdefault((call.pid, call.tid), []).append((call.ts, device[call.correlation]))
        cached = {}
        for thread, launches in by_thread.items():
            launches.sort()
            sums = [0.0]
            for _, us in launches:
                sums.append(sums[-1] + us)
            cached[thread] = ([ts for ts, _ in launches], sums)
        trace.__dict__["_launches_by_thread"] = cached
    total = 0.0
    by_thread_ops: dict[Any, list[tuple[float, float]]] = {}
    for op in ops:
        by_thread_ops.setdefault((op.pid, op.tid), []).append((op.ts, op.ts + op.dur))
    for thread, found in by_thread_ops.items():
        if thread not in cached:
            continue
        times, sums = cached[thread]
        for start, end in spans.merge(found):
            total += sums[bisect.bisect_left(times, end)] - sums[bisect.bisect_left(times, start)]
    return total


def top_operators(trace: Trace, top: int = 10) -> list[dict[str, Any]]:
    """Operators by the device time of the kernels they launched; on a trace with no device, by host *self* time
    (their own time, the ops they call taken out), so a parent and its child never count the same time twice."""
    on_host = not trace.has_gpu
    own = host_self_times(trace.cpu_ops) if on_host else {}
    device_time = op_device_time(trace)
    rows = np.arange(device_time.size) if on_host else np.flatnonzero(device_time)
    ops = trace.cpu_ops
    groups: dict[tuple[str, str], list[float]] = {}
    texts: dict[bytes, str] = {}
    for index, device in zip(rows.tolist(), device_time[rows].tolist(), strict=True):
        op = ops[index]
        key = (op.name or "?", op.input_dims_as(texts, _shapes_text))
        entry = groups.setdefault(key, [0, 0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += device
        entry[2] += op.dur or 0.0
        entry[3] += own.get(index, 0.0)
    ranked = sorted(groups.items(), key=lambda item: item[1][3 if on_host else 1], reverse=True)[:top]
    # time_us: the time the operators are ranked by (device time, or host self time on a trace with no device);
    # host_us stays the inclusive host time
    return [{"name": name, "input_shapes": shapes, "count": count, "device_self_us": device, "host_us": host,
             "time_us": round(host_self, 3) if on_host else device}
            for (name, shapes), (count, device, host, host_self) in ranked]


def _shapes_text(shapes: Any) -> str:
    return str(shapes) if shapes else ""


def host_self_times(ops: list[Any]) -> dict[int, float]:
    """Each op's host self time (µs), by its index in ``ops``: its duration less that of the ops nested directly
    inside it on the same thread."""
    by_thread: dict[Any, list[int]] = {}
    for index, op in enumerate(ops):
        if op.ts is not None and op.dur is not None:
            by_thread.setdefault((op.pid, op.tid), []).append(index)
    own: dict[int, float] = {}
    for indices in by_thread.values():
        indices.sort(key=lambda i: (ops[i].ts, -ops[i].dur))
        stack: list[int] = []
        for index in indices:
            op = ops[index]
            while stack and ops[stack[-1]].ts + ops[stack[-1]].dur <= op.ts:
                stack.pop()
            own[index] = float(op.dur)
            if stack:
                own[stack[-1]] -= min(float(op.dur), ops[stack[-1]].ts + ops[stack[-1]].dur - op.ts)
            stack.append(index)
    return {index: max(0.0, value) for index, value in own.items()}


def eligible_precision(trace: Trace) -> dict[str, float]:
    """Device time (µs) of Tensor-Core-eligible ops by input dtype: ``fp32``, ``half`` (fp16/bf16), ``unknown``."""
    out = {"fp32": 0.0, "half": 0.0, "unknown": 0.0}
    columns = trace.columns("cpu_ops")
    device_time = op_device_time(trace)
    rows = np.flatnonzero(columns.named(trace.names("cpu_ops", TENSOR_CORE_ELIGIBLE)) & (device_time != 0))
    memo: dict[bytes, Any] = {}
    for op, device in zip(columns.take(rows), device_time[rows].tolist(), strict=True):
        types = op.input_type_as(memo) or []
        if any(str(t) in HALF_TYPES for t in types):
            out["half"] += device
        elif any(str(t) in FP32_TYPES for t in types):
            out["fp32"] += device
        else:
            out["unknown"] += device
    return out


#: GEMM ops -> index of (A, B) among the inputs; A is [..., M, K], B is [..., K, N] (``aten::linear``'s weight
#: is [N, K]).
GEMM_OPERANDS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::matmul": (0, 1), "aten::addmm": (1, 2),
                 "aten::baddbmm": (1, 2), "aten::linear": (0, 1)}


def _inner_and_output(name: str, dims: list[Any]) -> tuple[Any, Any] | None:
    """(K, N) of a GEMM from its input shapes: the dimensions the model's sizes set (M is batch × tokens)."""
    a_index, b_index = GEMM_OPERANDS[name]
    if len(dims) <= b_index:
        return None
    a, b = dims[a_index], dims[b_index]
    if not (isinstance(a, list) and isinstance(b, list) and a and len(b) >= 2):
        return None
    return (a[-1], b[0]) if name == "aten::linear" else (a[-1], b[-1])


def misaligned_gemms(trace: Trace) -> list[dict[str, Any]]:
    """Half-precision GEMMs whose inner (K) or output (N) dimension is not a multiple of 8: Tensor Cores pad
    or fall back. Each entry has the op with its shapes, ``count`` and ``device_us`` (its kernels' time)."""
    columns = trace.columns("cpu_ops")
    rows = np.flatnonzero(columns.named(GEMM_OPERANDS))
    device_time = op_device_time(trace)[rows].tolist()
    found: dict[str, list[float]] = {}
    types_memo: dict[bytes, Any] = {}
    dims_memo: dict[bytes, Any] = {}
    for op, device in zip(columns.take(rows), device_time, strict=True):
        name = op.name or ""
        types = [str(t) for t in op.input_type_as(types_memo) or []]
        if not any(t in HALF_TYPES for t in types):
            continue
        dims = op.input_dims_as(dims_memo) or []
        sizes = _inner_and_output(name, dims)
        if sizes is None or not any(isinstance(size, int) and size % 8 for size in sizes):
            continue
        entry = found.setdefault(f"{name} {[d for d in dims if isinstance(d, list) and d]}", [0, 0.0])
        entry[0] += 1
        entry[1] += device
    ranked = sorted(found.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))[:5]
    return [{"op": key, "count": count, "device_us": device} for key, (count, device) in ranked]
