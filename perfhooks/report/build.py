"""The report built from step statistics, windows and diagnoses (the one builder), and the flat metric rows
(``perf/*``) that W&B and the transformers logs carry.
"""

from __future__ import annotations

import time
from typing import Any

from perfhooks import __version__
from perfhooks.events import OTHER, PHASES
from perfhooks.report.cost import ledger, price
from perfhooks.report.schema import SCHEMA_VERSION
from perfhooks.report.statistics import PhaseStatistics

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
                 started_at: float | None = None,
                 compile: dict[str, Any] | None = None,
                 unfinished_steps: int = 0,
                 throughput: dict[str, Any] | None = None,
                 named_work: dict[str, float] | None = None,
                 signal: str | None = None,
                 device_hour_cost: float | None = None) -> dict[str, Any]:
    step = stats.step.summary()
    steady = stats.steady_step.summary("_ms")
    spent = ledger(run, device, device_hour_cost)
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
        "updated_at": round(time.time(), 3),
        "status": status,
        "rank": rank,
        "world_size": world_size,
        "device": device,
        "steps": stats.steps,
        "micro_batches": stats.micro_batches,
        "step_ms": {"mean": step["mean"], "p50": step["p50"], "p95": step["p95"], "max": step["max"]},
        "phases": phases,
        "phase_steps": stats.sampled_steps,
        "coverage": round(stats.coverage, 6),
        "data_fetch_ms": {key: stats.fetch.summary("_ms")[f"{key}_ms"] for key in ("mean", "p50", "p95", "max")},
        "global_step": global_step if global_step is not None else stats.steps,
        "steady": {"steps": steady["count"], "perfhooks_steps": stats.own_steps,
                   "compiled_steps": stats.compiled_steps,
                   "step_ms": {key: steady[f"{key}_ms"] for key in ("mean", "p50", "p95", "max")},
                   "shares": {name: round(stats.steady_share(name), 6) for name in (*PHASES, OTHER)}},
        "windows": windows,
        "diagnoses": [price(diagnosis, spent) for diagnosis in diagnoses or []],
        "faults": list(faults or []),
        "series": _series([timing for timing in stats.recent if timing.detailed][-SERIES_STEPS:]),
    }
    if throughput is not None:
        report["throughput"] = throughput
    if named_work:
        report["named_work_ms"] = named_work
    if run is not None:
        report["run"] = run
    if spent is not None:
        report["ledger"] = spent
    if memory is not None:
        report["memory"] = memory
    if compile is not None:
        report["compile"] = compile
    if unfinished_steps:
        report["unfinished_steps"] = unfinished_steps
    if error is not None:
        report["error"] = error
    if signal is not None:  # the signal that ended the run, or one its program let it survive
        report["signal" if status == "terminated" else "survived_signal"] = signal
    return report


def _series(timings: list[Any]) -> dict[str, list[Any]]:
    """Per-step ms of each phase, the framework's step of each, and which steps perfhooks' own work overlapped."""
    series: dict[str, list[Any]] = {name: [round(timing.phase_ms.get(name, 0.0), 4) for timing in timings]
                                    for name in (*PHASES, OTHER)}
    series["global_step"] = [timing.global_step for timing in timings]
    series["perfhooks"] = [int(timing.own) for timing in timings]
    return series


def headline_metrics(report: dict[str, Any], top: int = 3) -> dict[str, float]:
    """The report's headline figures as flat numbers, for a trainer's logs and tracker panels.

    Keys: ``perf/step_ms``, ``perf/step_p95_ms``, ``perf/coverage``, ``perf/phase/<name>_ms``,
    ``perf/phase/<name>_share`` (0..1), ``perf/samples_per_s``, ``perf/tokens_per_s``, ``perf/mfu`` (0..1) and
    ``perf/achieved_flops_per_s`` where known, ``perf/compiling_s`` and ``perf/compilations`` when torch.compile
    compiled, and ``perf/diagnosis/<id>`` = estimated gain (0..1) for the top diagnoses (numbers only, so every
    logging integration accepts them).
    """
    metrics: dict[str, float] = {
        "perf/step_ms": report["step_ms"]["mean"],
        "perf/step_p95_ms": report["step_ms"]["p95"],
        "perf/coverage": report["coverage"],
    }
    for name, phase in report["phases"].items():
        metrics[f"perf/phase/{name}_ms"] = phase["mean_ms"]
        metrics[f"perf/phase/{name}_share"] = phase["share"]
    throughput = report.get("throughput") or {}
    for key in ("samples_per_s", "tokens_per_s", "mfu", "achieved_flops_per_s"):
        if isinstance(throughput.get(key), (int, float)):
            metrics[f"perf/{key}"] = float(throughput[key])
    run = report.get("run") or {}
    if run.get("compilations"):
        metrics["perf/compiling_s"] = run["compiling_s"]
        metrics["perf/compilations"] = float(run["compilations"])
    for diagnosis in report["diagnoses"][:top]:
        metrics[f"perf/diagnosis/{diagnosis['id']}"] = float(diagnosis.get("estimated_gain", 0.0))
    return metrics


def interval_metrics(timings: list[Any], memory: dict[str, Any] | None = None) -> dict[str, float]:
    """``perf/*`` figures over a run of resolved steps (:class:`perfhooks.report.statistics.StepTiming`).

    Keys: ``perf/step_ms`` (mean), ``perf/step_max_ms``, ``perf/phase/<name>_ms`` (mean per step),
    ``perf/phase/<name>_share`` (fraction 0..1 of step time), ``perf/coverage`` (0..1, the share
    the four phases account for), ``perf/steps_per_s``, ``perf/samples_per_s`` and ``perf/tokens_per_s`` (where
    the batches were seen) and ``perf/mem/<figure>_bytes`` from the latest memory sample.
    """
    metrics: dict[str, float] = {}
    if timings:
        total_ms = sum(t.step_ms for t in timings)
        detailed = [t for t in timings if t.detailed]
        detailed_ms = sum(t.step_ms for t in detailed)
        metrics["perf/step_ms"] = round(total_ms / len(timings), 4)
        metrics["perf/step_max_ms"] = round(max(t.step_ms for t in timings), 4)
        if total_ms > 0:
            metrics["perf/steps_per_s"] = round(1000.0 * len(timings) / total_ms, 4)
            samples, tokens = sum(t.samples for t in timings), sum(t.tokens for t in timings)
            if samples:
                metrics["perf/samples_per_s"] = round(1000.0 * samples / total_ms, 4)
            if tokens:
                metrics["perf/tokens_per_s"] = round(1000.0 * tokens / total_ms, 4)
        covered = 0.0
        for name in (*PHASES, OTHER) if detailed else ():
            phase_ms = sum(t.phase_ms.get(name, 0.0) for t in detailed)
            if name != OTHER:
                covered += phase_ms
            metrics[f"perf/phase/{name}_ms"] = round(phase_ms / len(detailed), 4)
            metrics[f"perf/phase/{name}_share"] = round(phase_ms / detailed_ms, 6) if detailed_ms > 0 else 0.0
        if detailed:
            metrics["perf/coverage"] = round(min(covered / detailed_ms, 1.0), 6) if detailed_ms > 0 else 0.0
    for key, value in (memory or {}).items():
        if key.endswith("_bytes") and isinstance(value, (int, float)):
            metrics[f"perf/mem/{key}"] = value
    return metrics


def status_line(report: dict[str, Any]) -> str | None:
    """One line for a run that did not complete (``None`` when it did): failed or interrupted, where, and the
    error, for the top of the page and the table."""
    status = report.get("status")
    if status in (None, "completed"):
        return None
    error = report.get("error") or {}
    kind = error.get("type")
    word = "INTERRUPTED" if kind == "KeyboardInterrupt" else str(status).upper()
    if report.get("signal"):
        word += f" by {report['signal']}"
    where = f" at step {error['step']}" if error.get("step") is not None else ""
    where += f" ({error['phase']})" if error.get("phase") else ""
    message = f": {kind}: {error.get('message', '')}".rstrip(": ") if kind else ""
    return f"Run {word}{where}{message}; the figures cover the steps before it"
