"""GEMM efficiency: FLOPs of a trace's matmul operators (from their input shapes, ``record_shapes``) against the
device time of the kernels they launched, and against the device's peak for their dtype.

The leaf matmul ops are counted (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm``): ``aten::matmul``
and ``aten::linear`` dispatch to them and launch nothing themselves. FLOPs are ``2·M·K·N`` (times the batch for
the batched ones). FP32 inputs are measured against the TF32 peak only when their kernels' names say TF32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfhooks.analysis.columns import ABSENT
from perfhooks.analysis.kernels import TF32_KERNEL
from perfhooks.analysis.peaks import find_peak
from perfhooks.analysis.trace import Trace

#: Leaf matmul ops -> the positions of their two matrix operands in ``Input Dims``.
GEMM_OPERANDS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2),
                 "aten::_scaled_mm": (0, 1)}
_DTYPES = {"float": "fp32", "c10::bfloat16": "bf16", "bfloat16": "bf16", "c10::half": "fp16", "half": "fp16",
           "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8",
           "c10::float8_e5m2fnuz": "fp8"}
TOP = 5


def gemm_flops(name: str, dims: Any) -> float | None:
    """FLOPs of one matmul op from its input dims; None when the shapes do not make a matmul."""
    positions = GEMM_OPERANDS.get(name)
    if positions is None or not isinstance(dims, list) or len(dims) <= max(positions):
        return None
    a, b = dims[positions[0]], dims[positions[1]]
    if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b) or len(a) not in (2, 3):
        return None
    if len(a) == 2:
        (m, k), (k2, n), batch = a, b, 1
    else:
        (batch, m, k), (batch2, k2, n) = a, b
        if batch != batch2:
            return None
    if k != k2:
        return None
    return 2.0 * batch * m * k * n


def gemm_efficiency(trace: Trace) -> dict[str, Any]:
    """``{gemms, flops, device_us, achieved_tflops, device, top: [...]}`` plus, where the device's peak for the
    GEMMs' dtype is known, ``peak_tflops`` and ``efficiency`` (0..1); empty when no GEMM launched a kernel."""
    ops, all_kernels = trace.columns("cpu_ops"), trace.columns("kernels")
    gemms = ops.named(GEMM_OPERANDS)
    ids = ops.external_id[gemms]
    kernels_by_op: dict[Any, list[Any]] = {}
    for event in all_kernels.take(np.isin(all_kernels.external_id, ids[ids != ABSENT])):
        kernels_by_op.setdefault(event.external_id, []).append(event)
    groups: dict[tuple[str, str, str], list[float]] = {}
    devices: dict[Any, float] = {}
    dims_memo: dict[bytes, Any] = {}
    types_memo: dict[bytes, Any] = {}
    for op in ops.take(gemms):
        name = op.name or ""
        kernels = kernels_by_op.get(op.external_id)
        if not kernels:
            continue
        dims = op.input_dims_as(dims_memo)
        flops = gemm_flops(name, dims)
        if flops is None:
            continue
        types = op.input_type_as(types_memo) or []
        first = GEMM_OPERANDS[name][0]
        dtype = _DTYPES.get(str(types[first]).lower(), "unknown") if len(types) > first else "unknown"
        if dtype == "fp32" and all(TF32_KERNEL.search(k.name or "") for k in kernels):
            dtype = "tf32"
        device_us = sum(k.dur for k in kernels)
        for kernel in kernels:
            devices[kernel.device] = devices.get(kernel.device, 0.0) + kernel.dur
        entry = groups.setdefault((name, str(dims), dtype), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += flops
        entry[2] += device_us
    if not groups:
        return {}
    device = max(devices, key=lambda d: devices[d]) if devices else None
    device_name = trace.device_name(device) if device is not None else None
    if device_name is None and len(trace.device_properties) == 1:  # one device visible to the process, whose
        device_name = next(iter(trace.device_properties.values())).get("name")  # kernels carry its physical index
    peak = find_peak(device_name)

    def peak_tflops(dtype: str) -> float | None:
        return peak.tflops.get(dtype) if peak is not None else None

    rows = []
    for (name, shapes, dtype), (count, flops, device_us) in groups.items():
        tflops = flops / device_us / 1e6 if device_us else 0.0
        row_peak = peak_tflops(dtype)
        rows.append({"name": name, "input_shapes": shapes, "dtype": dtype, "count": count, "flops": flops,
                     "device_us": round(device_us, 3), "achieved_tflops": round(tflops, 2),
                     "efficiency": round(tflops / row_peak, 4) if row_peak else None})
    rows.sort(key=lambda row: -row["device_us"])
    total_flops = sum(row["flops"] for row in rows)
    total_us = sum(row["device_us"] for row in rows)
    by_dtype: dict[str, float] = {}
    for row in rows:
        by_dtype[row["dtype"]] = by_dtype.get(row["dtype"], 0.0) + row["device_us"]
    main_dtype = max(by_dtype, key=lambda d: by_dtype[d])
    achieved = total_flops / total_us / 1e6 if total_us else 0.0
    section: dict[str, Any] = {"gemms": sum(row["count"] for row in rows), "flops": total_flops,
                               "device_us": round(total_us, 3), "achieved_tflops": round(achieved, 2),
                               "device": device_name, "dtype": main_dtype, "peak_tflops": peak_tflops(main_dtype),
                               "efficiency": None, "top": rows[:TOP]}
    peaks = {dtype: peak_tflops(dtype) for dtype in by_dtype}
    if all(peaks.values()) and total_us:
        # the time the GEMMs would take at peak, each at its dtype's, over the time they took
        ideal_us = sum(row["flops"] / (peaks[row["dtype"]] * 1e6) for row in rows)  # type: ignore[operator]
        section["efficiency"] = round(ideal_us / total_us, 4)
    else:
        missing = sorted(dtype for dtype, value in peaks.items() if not value)
        section["missing"] = f"no {'/'.join(missing)} peak for {device_name!r} in perfhooks' table"
    return section
