"""The report's ``throughput`` section: samples and tokens per second, FLOPs per step with their source, MFU
against the device's peak, and the waterfall from the ideal step to the measured one.

All times are the steady steps' means (ms): the steps no perfhooks work overlapped. Nothing is guessed: a figure
with no source is None, with a line that says which input is missing.
"""

from __future__ import annotations

from typing import Any

#: Verdicts that explain a waterfall part, most specific first.
EXPLAINED_BY = {
    "data_wait_ms": ("dataloader_bound",),
    "device_idle_ms": ("launch_bound", "host_bound", "host_sync", "memcpy_heavy", "low_gpu_utilization"),
    "compute_beyond_ideal_ms": ("fp32_matmul", "unfused_attention", "tensor_core_alignment", "low_occupancy"),
    "other_ms": ("step_time_variance",),
}


def throughput_section(stats: Any, flops: dict[str, Any], device: dict[str, Any], dtype: tuple[str, str],
                       peak_flops: float | None, window: dict[str, Any] | None,
                       diagnoses: list[dict[str, Any]], token_source: str | None = None,
                       device_peak: tuple[float, str] | None = None) -> dict[str, Any]:
    """``stats``: :class:`~perfhooks.report.statistics.PhaseStatistics`; ``flops``: ``{"per_step", "source"}`` or
    ``{"missing"}``; ``dtype``: ``(matmul dtype, where it came from)``; ``peak_flops``: the user's peak (FLOP/s);
    ``window``: the latest analysed window's metrics (GPU busy share); ``device_peak``: the CUDA device's dense
    peak for ``dtype`` from perfhooks' table, ``(FLOP/s, its source)``, or None when the table has none."""
    samples_per_s, tokens_per_s, steps = stats.throughput()
    step_ms = stats.steady_step.mean if stats.steady_step.count else stats.step.mean
    section: dict[str, Any] = {
        "steps": steps,
        "samples_per_s": round(samples_per_s, 4) if stats.samples else None,
        "tokens_per_s": round(tokens_per_s, 4) if stats.tokens else None,
        # of the detailed steps, whose batches were counted (a light step's are not: the budget's sample)
        "samples_per_step": round(stats.samples / stats.sampled_steps, 4) if stats.samples else None,
        "tokens_per_step": round(stats.tokens / stats.sampled_steps, 4) if stats.tokens else None,
        "token_source": token_source if stats.tokens else None,
        "flops_per_step": flops.get("per_step"),
        "flops_source": flops.get("source"),
        # the framework's own count where it has one (HF: 6 x non-embedding parameters x tokens), by its own name
        "framework_flops_per_step": flops.get("framework_per_step"),
        "framework_flops_source": flops.get("framework_source"),
        "achieved_flops_per_s": None,
        "matmul_dtype": dtype[0],
        "dtype_source": dtype[1],
        "peak_flops_per_s": None,
        "peak_source": None,
        "mfu": None,
        "missing": [],
        "waterfall": None,
    }
    missing = section["missing"]
    if section["samples_per_s"] is None:
        missing.append("samples: no batch with a leading dimension was seen")
    per_step = flops.get("per_step")
    if per_step and step_ms > 0:
        section["achieved_flops_per_s"] = round(per_step / (step_ms / 1e3), 1)
    elif not per_step:
        missing.append(f"FLOPs per step: {flops.get('missing') or 'no source'}")
    if peak_flops:
        section["peak_flops_per_s"], section["peak_source"] = float(peak_flops), "user: peak_flops"
    elif device.get("type") == "cuda":
        if device_peak is not None:
            section["peak_flops_per_s"], section["peak_source"] = device_peak
        else:
            missing.append(f"peak: no {dtype[0]} peak for {device.get('name')!r} in perfhooks' table; pass "
                           "peak_flops")
    else:
        missing.append(f"peak: none for a {device.get('type', 'cpu')} device; pass peak_flops for MFU")
    peak = section["peak_flops_per_s"]
    if per_step and peak and step_ms > 0:
        mfu = per_step / (step_ms / 1e3) / peak
        if mfu > 1.0:  # no run beats its device's peak: the peak or the dtype is wrong, so no figure is given
            missing.append(f"MFU: the achieved {per_step / (step_ms / 1e3):.3g} FLOP/s is {mfu:.2f}x the peak "
                           f"({peak:.3g} FLOP/s, {section['peak_source']}) for {dtype[0]} ({dtype[1]}): the peak or "
                           "the dtype is wrong; pass peak_flops for the dtype the matmuls run in")
        else:
            section["mfu"] = round(mfu, 6)
            section["waterfall"] = waterfall(stats, step_ms, per_step / peak * 1e3, window, diagnoses)
    return section


def waterfall(stats: Any, step_ms: float, ideal_ms: float, window: dict[str, Any] | None,
              diagnoses: list[dict[str, Any]]) -> dict[str, Any]:
    """From the ideal step (FLOPs / peak) to the measured one (ms); the parts add up to ``step_ms``.

    With a window's GPU busy share: device compute beyond the ideal, device idle inside the step (host-bound
    work, launches, syncs), the exposed data wait and ``other``. Without one (a CPU, no window), compute and idle
    are one part, ``compute_and_idle_ms``, not split.
    """
    data_ms = stats.steady_mean("data_wait")
    other_ms = stats.steady_mean("other")
    parts: dict[str, float | None] = {"ideal_ms": ideal_ms, "compute_beyond_ideal_ms": None, "device_idle_ms": None,
                                      "compute_and_idle_ms": None, "data_wait_ms": data_ms, "other_ms": other_ms}
    busy_share = (window or {}).get("gpu_utilization")
    rest = step_ms - ideal_ms - data_ms - other_ms
    if busy_share is not None and 0 < busy_share <= 1:
        busy_ms = busy_share * step_ms
        idle_ms = step_ms - busy_ms - data_ms - other_ms
        if busy_ms >= ideal_ms and idle_ms >= 0:
            parts["compute_beyond_ideal_ms"] = busy_ms - ideal_ms
            parts["device_idle_ms"] = idle_ms
    if parts["compute_beyond_ideal_ms"] is None:
        parts["compute_and_idle_ms"] = rest
    rounded = {key: (round(value, 4) if value is not None else None) for key, value in parts.items()}
    losses = {key: value for key, value in parts.items() if key != "ideal_ms" and value is not None}
    largest = max(losses, key=lambda key: losses[key]) if losses else None
    present = {d["id"] for d in diagnoses}
    explained = next((i for i in EXPLAINED_BY.get(largest or "", ()) if i in present), None)
    return {"step_ms": round(step_ms, 4), **rounded, "largest": largest, "explained_by": explained}
