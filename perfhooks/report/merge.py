"""One run's report from several ranks: each rank's summary, the ``ranks`` section, and the cross-rank rules."""

from __future__ import annotations

from typing import Any

from perfhooks.events import RANK_WAITS
from perfhooks.report.cost import merged_ledger, price_merged
from perfhooks.rules.pipeline import merge_verdicts
from perfhooks.rules.ranks import diagnose_stragglers
from perfhooks.rules.stalls import diagnose_stalls
from perfhooks.rules.thresholds import Thresholds

#: Stack frames of each stall a rank's summary carries (the innermost).
STALL_FRAMES = 5


def merge_rank_reports(reports: list[dict[str, Any]], thresholds: Any = None, source: str = "folder",
                       expected: int | None = None) -> dict[str, Any]:
    """One run's report from its per-rank reports (see :func:`merge_summaries`)."""

    by_rank = sorted(reports, key=lambda r: r["rank"])
    return merge_summaries(by_rank[0], [rank_summary(r) for r in by_rank], thresholds, source,
                           expected or max(r.get("world_size") or 1 for r in by_rank))


def merge_summaries(base: dict[str, Any], summaries: list[dict[str, Any]], thresholds: Any = None,
                    source: str = "folder", expected: int | None = None,
                    diagnoses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The one merge: ``base`` (the lowest rank's report), plus the ``ranks`` section built from every rank's
    summary (:func:`perfhooks.report.merge.ranks_section`) and the cross-rank ``straggler`` rule. ``diagnoses``:
    the per-rank diagnoses to keep (default: the base's)."""

    merged = dict(base)
    merged["ranks"] = ranks_section(summaries, expected or len(summaries), source)
    cross = diagnose_stragglers(summaries, thresholds or Thresholds())
    stalls = [stall for s in summaries for stall in s.get("stalls") or []]
    if stalls:  # every rank's stalls: who is stuck, and what the others waited in
        merged["stalls"] = stalls
        cross += diagnose_stalls(stalls)
    local = base.get("diagnoses") or [] if diagnoses is None else diagnoses
    replaced = {d["id"] for d in cross}  # a verdict of the ranks together stands for each rank's own
    diagnoses_kept = merge_verdicts(live=[d for d in local if d["id"] not in replaced], ranks=cross)
    spent = merged_ledger([s.get("ledger") for s in summaries])
    if spent is not None:  # the waste ledger sums over the ranks
        merged["ledger"] = spent
        costs = [s.get("costs") or {} for s in summaries]
        diagnoses_kept = [price_merged(d, costs, spent) for d in diagnoses_kept]
    merged["diagnoses"] = diagnoses_kept
    if any(s.get("status") == "failed" for s in summaries):
        merged["status"] = "failed"
    if base.get("throughput"):
        merged["throughput"] = run_throughput(base["throughput"], summaries)
    return merged


def run_throughput(base: dict[str, Any], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's samples and tokens per second: the sum over the ranks that reported them (each rank's own
    figure is in ``ranks.per_rank``). MFU and the waterfall stay the base rank's (per device)."""
    merged = dict(base)
    for key in ("samples_per_s", "tokens_per_s"):
        values = [s[key] for s in summaries if isinstance(s.get(key), (int, float))]
        merged[key] = round(sum(values), 4) if values else None
    merged["ranks_summed"] = len([s for s in summaries if isinstance(s.get("samples_per_s"), (int, float))])
    return merged


# ----------------------------------------------------------------------------- one rank-merge schema
def rank_summary(report: dict[str, Any]) -> dict[str, Any]:
    """A rank's entry in a merged report (a few KB), from its report: a run's ``report.rank{R}.json`` or
    ``perfhooks analyze``'s report of one trace. It is what travels between ranks (the store, the folder).

    ``step_ms`` is {mean, p50, p95, max} (ms); ``shares`` and ``phases_ms`` are perfhooks' phases (zero when
    the source has none); ``collective_ms_per_step`` is the time in collectives per step in the latest
    analysed window (the wait for the other ranks is inside it), or None; ``rank_wait_ms`` is the named host
    work per step that waits for the other ranks (:data:`perfhooks.events.RANK_WAITS`).
    """
    metrics = report.get("metrics")
    if metrics is None:  # a run's report: the latest analysed window's figures
        analysed = [w["metrics"] for w in report.get("windows") or [] if w.get("metrics")]
        metrics = analysed[-1] if analysed else {}
    phases = report.get("phases") or {}
    step_ms = report.get("step_ms") or {}
    if not step_ms.get("mean") and metrics.get("step_us"):  # a trace: its device-side steps
        step_ms = {"mean": metrics["step_us"] / 1e3, "p50": (metrics.get("step_us_p50") or 0.0) / 1e3,
                   "p95": None, "max": None}
    return {"rank": report["rank"], "status": report.get("status"), "steps": report.get("steps"),
            "step_ms": step_ms, "coverage": report.get("coverage"),
            "shares": {name: phase.get("share", 0.0) for name, phase in phases.items()},
            "phases_ms": {name: phase.get("mean_ms", 0.0) for name, phase in phases.items()},
            "collective_ms_per_step": metrics.get("collective_ms_per_step"),
            "rank_wait_ms": round(sum(ms for name, ms in (report.get("named_work_ms") or {}).items()
                                      if name in RANK_WAITS), 4),
            "gpu_utilization": metrics.get("gpu_utilization"),
            "samples_per_s": (report.get("throughput") or {}).get("samples_per_s"),
            "tokens_per_s": (report.get("throughput") or {}).get("tokens_per_s"),
            "diagnoses": [d["id"] for d in report.get("diagnoses") or []], "faults": len(report.get("faults") or []),
            "ledger": report.get("ledger"),
            "costs": {d["id"]: d["cost"] for d in report.get("diagnoses") or [] if d.get("cost")},
            "stalls": [{**stall, "stack": stall.get("stack", [])[-STALL_FRAMES:]}
                       for stall in report.get("stalls") or []],
            "path": (report.get("source") or {}).get("path")}


def ranks_section(summaries: list[dict[str, Any]], expected: int, source: str) -> dict[str, Any]:
    """The merged report's ``ranks`` section, from the ranks' summaries (:func:`rank_summary`).

    ``source``: ``store`` (the process group's key-value store), ``folder`` (``report.rank{R}.json`` files)
    or ``traces`` (``perfhooks analyze`` on a folder of per-rank traces). ``missing``: the ranks of
    ``range(expected)`` that sent nothing in time.
    """
    by_rank = sorted(summaries, key=lambda s: s["rank"])
    step_ms = {s["rank"]: s["step_ms"]["mean"] for s in by_rank if (s.get("step_ms") or {}).get("mean")}
    values = sorted(step_ms.values())
    median = values[len(values) // 2] if values else 0.0
    present = {s["rank"] for s in by_rank}
    return {"count": len(by_rank), "expected": expected, "missing": [r for r in range(expected) if r not in present],
            "source": source, "step_ms": {str(k): v for k, v in step_ms.items()},
            "spread": (values[-1] - values[0]) / median if median else 0.0, "per_rank": by_rank}
