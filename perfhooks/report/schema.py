"""The ``report.json`` contract: schema version 3, its required keys, validation and strict JSON.

Keys are only ever added within a version; a key that changes meaning or goes away bumps ``schema_version``
(README, "The report"). 2 made ``ranks`` one schema for runs and ``perfhooks analyze``. 3: on a GPU,
``phases.data_wait`` is the exposed wait (device-timed) and ``data_fetch_ms`` the host fetch; the CUDA memory
signal ``used_bytes`` counts reserved and outside-PyTorch memory against the limit (``memory.limit``); and
``run.compiling_s``, ``run.compilations``, ``steady.compiled_steps`` and the ``compile`` section are new. Added
within 3: the ``throughput`` section (samples and tokens per second, FLOPs per step and their source, MFU, the
waterfall); the ``ledger`` section and each diagnosis' ``cost`` (the waste in device-hours, and in money with a
price per device-hour); the ``settings`` section (the settings audit's read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfhooks.events import OTHER, PHASES

SCHEMA_VERSION = 3

REPORT_FILE = "report.json"

#: Top-level keys every version-1 report has.
REQUIRED_KEYS: tuple[str, ...] = (
    "schema_version", "perfhooks_version", "framework", "status", "rank", "world_size", "device",
    "steps", "micro_batches", "step_ms", "phases", "coverage", "windows", "diagnoses", "faults",
)


#: Keys of each ``diagnoses`` entry.
DIAGNOSIS_KEYS: tuple[str, ...] = ("id", "severity", "title", "evidence", "recommendation")

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")


def report_path(output_dir: Path, rank: int, world_size: int) -> Path:
    """``report.json`` for a single process; ``report.rank{R}.json`` per rank in a multi-process run."""
    return output_dir / (REPORT_FILE if world_size <= 1 else f"report.rank{rank}.json")


def new_run_id() -> str:
    """An id for one run (one engine), unique across processes and machines."""
    import uuid

    return uuid.uuid4().hex[:16]


def validate_report(report: dict[str, Any]) -> list[str]:
    """Problems that make ``report`` break the version-1 contract (empty when it holds)."""
    problems = [f"missing key {key!r}" for key in REQUIRED_KEYS if key not in report]
    if report.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version is {report.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    for key in ("mean", "p50", "p95", "max"):
        if not isinstance(report.get("step_ms", {}).get(key), (int, float)):
            problems.append(f"step_ms.{key} is not a number")
    for name in (*PHASES, OTHER):
        phase = report.get("phases", {}).get(name)
        if not isinstance(phase, dict):
            problems.append(f"phases.{name} is missing")
            continue
        for key in ("mean_ms", "p50_ms", "p95_ms", "max_ms", "share"):
            if not isinstance(phase.get(key), (int, float)):
                problems.append(f"phases.{name}.{key} is not a number")
    for window in report.get("windows", []):
        for key in ("path", "first_step", "last_step"):
            if key not in window:
                problems.append(f"a window lacks {key!r}")
    for diagnosis in report.get("diagnoses", []):
        problems += [f"a diagnosis lacks {key!r}" for key in DIAGNOSIS_KEYS if key not in diagnosis]
        if diagnosis.get("severity") not in SEVERITIES:
            problems.append(f"diagnosis severity {diagnosis.get('severity')!r} is not one of {SEVERITIES}")
    return problems


def json_safe(value: Any, where: str = "", replaced: list[str] | None = None) -> Any:
    """``value`` with every NaN or infinity replaced by ``None`` (JSON has neither); their paths go to ``replaced``."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        if replaced is not None:
            replaced.append(where or "$")
        return None
    if isinstance(value, dict):
        return {key: json_safe(item, f"{where}.{key}" if where else str(key), replaced) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item, f"{where}[{index}]", replaced) for index, item in enumerate(value)]
    return value
