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
    return {key: metrics.get(key) for key in WINDOW_METRICS}, diagnoses
