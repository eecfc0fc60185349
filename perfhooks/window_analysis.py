"""A window's trace, analysed in a separate interpreter (``perfhooks analyze``, which imports no torch).

In the training process the analysis would hold the GIL for a second or so and slow the steps it
overlaps; as a child process it runs beside them. Runs on the writer thread, after the export.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The figures of a window's analysis that go into its record (and W&B).
WINDOW_METRICS = ("gpu_utilization", "sm_efficiency", "achieved_occupancy")
#: Operators and kernels kept in a window's record.
TOP_WORK = 5


def analysis_command(path: Path, thresholds: Any) -> list[str]:
    return [sys.executable, "-m", "perfhooks.cli", "analyze", str(path), "--format", "json",
            "--thresholds", json.dumps(dataclasses.asdict(thresholds))]


def analyze_window(path: Path, thresholds: Any, first_step: int, timeout_s: float = 600.0
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(metrics for the window record, diagnoses tagged with the window's first step)``; raises on failure."""
    done = subprocess.run(analysis_command(path, thresholds), capture_output=True, text=True, timeout=timeout_s,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    result = json.loads(done.stdout)
    metrics = result["metrics"]
    diagnoses = result["diagnoses"]
    for diagnosis in diagnoses:
        diagnosis["step"] = first_step
    return {**{key: metrics.get(key) for key in WINDOW_METRICS}, **top_work(metrics)}, diagnoses


def top_work(metrics: dict[str, Any], top: int = TOP_WORK) -> dict[str, list[dict[str, Any]]]:
    """The window's top operators (device time where the trace has a device, else host time) and top kernels:
    name, ms per step and share 0..1 of the step."""
    steps = max(metrics.get("steps") or 1, 1)
    step_us = metrics.get("step_us") or 0.0
    on_device = bool(metrics.get("devices"))

    def row(name: str, total_us: float, **extra: Any) -> dict[str, Any]:
        per_step = total_us / steps
        return {"name": name, "ms_per_step": round(per_step / 1e3, 4),
                "share": round(per_step / step_us, 4) if step_us else None, **extra}

    operators = [row(op["name"], op["device_self_us"] if on_device else op["host_us"],
                     input_shapes=op.get("input_shapes") or "") for op in (metrics.get("top_operators") or [])[:top]]
    kernels = [row(k["name"], k["total_us"]) for k in ((metrics.get("kernels") or {}).get("top") or [])[:top]]
    return {"top_operators": operators, "top_kernels": kernels}
