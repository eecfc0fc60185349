"""The ``report.json`` document: the public contract, built by this module alone.

Schema version 2 (README, "The report"; 2 made ``ranks`` one schema for runs and ``perfhooks analyze``).
Keys are only ever added within a version; a key that changes meaning or goes away bumps ``schema_version``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfhooks import __version__
from perfhooks.files import atomic_write_json
from perfhooks.phases import OTHER, PHASES
from perfhooks.timeline import PhaseStatistics

SCHEMA_VERSION = 2
REPORT_FILE = "report.json"

#: Top-level keys every version-1 report has.
REQUIRED_KEYS: tuple[str, ...] = (
    "schema_version", "perfhooks_version", "framework", "status", "rank", "world_size", "device",
    "steps", "micro_batches", "step_ms", "phases", "coverage", "windows", "diagnoses", "faults",
)
#: Keys of each ``diagnoses`` entry.
DIAGNOSIS_KEYS: tuple[str, ...] = ("id", "severity", "title", "evidence", "recommendation")
SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")


#: Steps of per-phase time series kept in the report (the most recent), for the HTML page and panels.
SERIES_STEPS = 500


def build_report(*, framework: str, status: str, rank: int, world_size: int, device: dict[str, Any],
                 stats: PhaseStatistics, windows: list[dict[str, Any]],
                 diagnoses: list[dict[str, Any]] | None = None,
                 faults: list[dict[str, Any]] | None = None,
                 error: dict[str, Any] | None = None,
                 memory: dict[str, Any] | None = None,
                 run: dict[str, Any] | None = None,
                 global_step: int | None = None,
                 run_id: str | None = None,
                 started_at: float | None = None) -> dict[str, Any]:
    step = stats.step.summary()
    steady = stats.steady_step.summary("_ms")
    phases = {}
    for name in (*PHASES, OTHER):
        phase = stats.phases[name].summary("_ms")
        phase.pop("count")
        phase["share"] = round(stats.share(name), 6)
        phases[name] = phase
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "perfhooks_version": __version__,
        "framework": framework,
        "run_id": run_id,
        "started_at": started_at,
        "status": status,
        "rank": rank,
        "world_size": world_size,
        "device": device,
        "steps": stats.steps,
        "micro_batches": stats.micro_batches,
        "step_ms": {"mean": step["mean"], "p50": step["p50"], "p95": step["p95"], "max": step["max"]},
        "phases": phases,
        "coverage": round(stats.coverage, 6),
        "global_step": global_step if global_step is not None else stats.steps,
        "steady": {"steps": steady["count"], "perfhooks_steps": stats.own_steps,
                   "step_ms": {key: steady[f"{key}_ms"] for key in ("mean", "p50", "p95", "max")},
                   "shares": {name: round(stats.steady_share(name), 6) for name in (*PHASES, OTHER)}},
        "windows": windows,
        "diagnoses": list(diagnoses or []),
        "faults": list(faults or []),
        "series": _series(list(stats.recent)[-SERIES_STEPS:]),
    }
    if run is not None:
        report["run"] = run
    if memory is not None:
        report["memory"] = memory
    if error is not None:
        report["error"] = error
    return report


def _series(timings: list[Any]) -> dict[str, list[Any]]:
    """Per-step ms of each phase, the framework's step of each, and which steps perfhooks' own work overlapped."""
    series: dict[str, list[Any]] = {name: [round(timing.phase_ms.get(name, 0.0), 4) for timing in timings]
                                    for name in (*PHASES, OTHER)}
    series["global_step"] = [timing.global_step for timing in timings]
    series["perfhooks"] = [int(timing.own) for timing in timings]
    return series


def report_path(output_dir: Path, rank: int, world_size: int) -> Path:
    """``report.json`` for a single process; ``report.rank{R}.json`` per rank in a multi-process run."""
    return output_dir / (REPORT_FILE if world_size <= 1 else f"report.rank{rank}.json")


def new_run_id() -> str:
    """An id for one run (one engine), unique across processes and machines."""
    import uuid

    return uuid.uuid4().hex[:16]


def write_report(output_dir: Path, report: dict[str, Any]) -> Path | None:
    """``report.json`` and, beside it, the same content as a self-contained ``report.html``.

    A write loses (nothing is written, ``None``) when the file on disk is newer: a later run's
    report (a retry, the next run of a sweep), or this run's final report when ``report`` was
    taken at a window's end.
    """
    path = report_path(output_dir, report["rank"], report["world_size"])
    if not supersedes(report, _read_json(path)):
        return None
    _write_json_and_html(path, report)
    return path


def supersedes(report: dict[str, Any], on_disk: dict[str, Any] | None) -> bool:
    """Whether ``report`` may replace ``on_disk``: same run and not a window-end write over a final one,
    or a run that started no earlier."""
    if not on_disk or report.get("run_id") is None:
        return True
    if on_disk.get("run_id") == report["run_id"]:
        return not (report.get("status") == "running" and on_disk.get("status") != "running")
    return float(report.get("started_at") or 0.0) >= float(on_disk.get("started_at") or 0.0)


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json_and_html(path: Path, report: dict[str, Any]) -> None:
    from perfhooks.files import atomic_write_bytes
    from perfhooks.sinks.html import render_html

    atomic_write_json(path, report)
    atomic_write_bytes(path.with_suffix(".html"), render_html(report, series=report.get("series")).encode())


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


def headline_metrics(report: dict[str, Any], top: int = 3) -> dict[str, float]:
    """The report's headline figures as flat numbers, for a trainer's logs and tracker panels.

    Keys: ``perf/step_ms``, ``perf/step_p95_ms``, ``perf/coverage``, ``perf/phase/<name>_ms``,
    ``perf/phase/<name>_share`` (0..1), and ``perf/diagnosis/<id>`` = estimated gain (0..1) for
    the top diagnoses (numbers only, so every logging integration accepts them).
    """
    metrics: dict[str, float] = {
        "perf/step_ms": report["step_ms"]["mean"],
        "perf/step_p95_ms": report["step_ms"]["p95"],
        "perf/coverage": report["coverage"],
    }
    for name, phase in report["phases"].items():
        metrics[f"perf/phase/{name}_ms"] = phase["mean_ms"]
        metrics[f"perf/phase/{name}_share"] = phase["share"]
    for diagnosis in report["diagnoses"][:top]:
        metrics[f"perf/diagnosis/{diagnosis['id']}"] = float(diagnosis.get("estimated_gain", 0.0))
    return metrics


def interval_metrics(timings: list[Any], memory: dict[str, Any] | None = None) -> dict[str, float]:
    """``perf/*`` figures over a run of resolved steps (:class:`perfhooks.timeline.StepTiming`).

    Keys: ``perf/step_ms`` (mean), ``perf/step_max_ms``, ``perf/phase/<name>_ms`` (mean per step),
    ``perf/phase/<name>_share`` (fraction 0..1 of step time), ``perf/coverage`` (0..1, the share
    the four phases account for), ``perf/steps_per_s`` and ``perf/mem/<figure>_bytes`` from the
    latest memory sample.
    """
    metrics: dict[str, float] = {}
    if timings:
        total_ms = sum(t.step_ms for t in timings)
        metrics["perf/step_ms"] = round(total_ms / len(timings), 4)
        metrics["perf/step_max_ms"] = round(max(t.step_ms for t in timings), 4)
        if total_ms > 0:
            metrics["perf/steps_per_s"] = round(1000.0 * len(timings) / total_ms, 4)
        covered = 0.0
        for name in (*PHASES, OTHER):
            phase_ms = sum(t.phase_ms.get(name, 0.0) for t in timings)
            if name != OTHER:
                covered += phase_ms
            metrics[f"perf/phase/{name}_ms"] = round(phase_ms / len(timings), 4)
            metrics[f"perf/phase/{name}_share"] = round(phase_ms / total_ms, 6) if total_ms > 0 else 0.0
        metrics["perf/coverage"] = round(min(covered / total_ms, 1.0), 6) if total_ms > 0 else 0.0
    for key, value in (memory or {}).items():
        if key.endswith("_bytes") and isinstance(value, (int, float)):
            metrics[f"perf/mem/{key}"] = value
    return metrics


def merge_rank_reports(reports: list[dict[str, Any]], thresholds: Any = None, source: str = "folder",
                       expected: int | None = None) -> dict[str, Any]:
    """One run's report from its per-rank reports (see :func:`merge_summaries`)."""
    from perfhooks.ranks import rank_summary

    by_rank = sorted(reports, key=lambda r: r["rank"])
    return merge_summaries(by_rank[0], [rank_summary(r) for r in by_rank], thresholds, source,
                           expected or max(r.get("world_size") or 1 for r in by_rank))


def merge_summaries(base: dict[str, Any], summaries: list[dict[str, Any]], thresholds: Any = None,
                    source: str = "folder", expected: int | None = None,
                    diagnoses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The one merge: ``base`` (the lowest rank's report), plus the ``ranks`` section built from every rank's
    summary (:func:`perfhooks.ranks.ranks_section`) and the cross-rank ``straggler`` rule. ``diagnoses``:
    the per-rank diagnoses to keep (default: the base's)."""
    from perfhooks.analysis.diagnoses import Thresholds, diagnose_stragglers, rank
    from perfhooks.ranks import ranks_section

    merged = dict(base)
    merged["ranks"] = ranks_section(summaries, expected or len(summaries), source)
    cross = diagnose_stragglers(summaries, thresholds or Thresholds())
    merged["diagnoses"] = rank(list(base.get("diagnoses") or [] if diagnoses is None else diagnoses) + cross)
    if any(s.get("status") == "failed" for s in summaries):
        merged["status"] = "failed"
    return merged


def write_merged_report(output_dir: Path, world_size: int, thresholds: Any = None) -> Path | None:
    """Once every rank's final ``report.rank{R}.json`` is there, ``report.json`` (and ``.html``) for the whole run.

    Each rank calls this after writing its own report; the last to finish sees them all. No
    collective is involved, so a rank that died or is slow delays nothing.
    """
    reports = rank_reports(output_dir, range(world_size), final=True)
    if reports is None:
        return None
    target = output_dir / REPORT_FILE
    merged = merge_rank_reports(reports, thresholds)
    if not supersedes(merged, _read_json(target)):
        return None
    _write_json_and_html(target, merged)
    return target


def write_run_report(output_dir: Path, merged: dict[str, Any]) -> Path | None:
    """Rank 0's merged report (from the store) as ``report.json`` (and ``.html``), unless a newer one is there."""
    target = output_dir / REPORT_FILE
    if not supersedes(merged, _read_json(target)):
        return None
    _write_json_and_html(target, merged)
    return target


def rank_reports(output_dir: Path, ranks: Any, wait_s: float = 0.0, final: bool = False
                 ) -> list[dict[str, Any]] | None:
    """The ``report.rank{R}.json`` of ``ranks``, polling up to ``wait_s`` seconds (no collective);
    with ``final``, only end-of-training ones count (not those a window's end wrote). ``None`` if one
    is still missing then."""
    import json
    import time

    deadline = time.monotonic() + wait_s
    paths = [output_dir / f"report.rank{r}.json" for r in ranks]
    while True:
        try:
            reports = [json.loads(p.read_text()) for p in paths]
            if not final or all(r.get("status") not in ("running", None) for r in reports):
                return reports
        except (OSError, ValueError):  # not written yet (written atomically: never half a file)
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


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
