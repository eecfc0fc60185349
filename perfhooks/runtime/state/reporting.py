"""A run's report from a published :class:`~perfhooks.runtime.state.run_state.RunState`, on any thread.

The reader thaws the state's statistics into a copy of its own, runs the rules on it through the one pipeline
(:func:`perfhooks.rules.pipeline.merge_verdicts`) and hands everything to the one builder
(:func:`perfhooks.report.build.build_report`). Nothing here reads the engine's live objects.
"""

from __future__ import annotations

from typing import Any

from perfhooks.faults import FaultLog
from perfhooks.report.build import build_report
from perfhooks.report.statistics import PhaseStatistics
from perfhooks.report.throughput import throughput_section
from perfhooks.rules.compile import diagnose_compile
from perfhooks.rules.live import diagnose_live
from perfhooks.rules.memory import diagnose_memory
from perfhooks.rules.pipeline import merge_verdicts
from perfhooks.rules.stalls import diagnose_stalls
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import Diagnosis
from perfhooks.runtime.state.run_state import ReportParts, RunFacts, RunState

#: Steady steps the run needs before its median step judges a window's utilization (more than a window holds).
MIN_STEADY_STEPS = 8


def local_verdicts(stats: PhaseStatistics, parts: ReportParts, thresholds: Thresholds,
                   framework: str | None = None, accelerator: bool = True,
                   cpus: int | None = None, framework_version: str | None = None) -> list[Diagnosis]:
    """The verdicts this rank's own figures give: live phase timings, compile counts, memory (not yet the
    trace's). ``cpus``: the CPUs this process may use; ``framework_version``: the framework's installed version."""
    return [*diagnose_live(stats, thresholds, compiled=parts.compiled_in_run, run=parts.run,
                           named_work=parts.named_work, framework=framework, accelerator=accelerator, cpus=cpus,
                           framework_version=framework_version, length_grouped=parts.length_grouped),
            *diagnose_compile(parts.compile, parts.run, thresholds),
            *(diagnose_memory(parts.memory_figures, thresholds) if parts.memory_figures is not None else [])]


def run_verdicts(stats: PhaseStatistics, parts: ReportParts, thresholds: Thresholds, faults: FaultLog,
                 stalls: list[dict[str, Any]] | None = None, framework: str | None = None,
                 accelerator: bool = True, cpus: int | None = None,
                 framework_version: str | None = None) -> list[Diagnosis]:
    """Every verdict of the run so far, merged (a fault in a rule is reported once; the trace's verdicts stand)."""
    try:
        local = (local_verdicts(stats, parts, thresholds, framework, accelerator, cpus, framework_version)
                 + diagnose_stalls(stalls or []))
    except Exception as error:
        faults.report("live_diagnoses", error)
        local = []
    steady = stats.steady_step
    return merge_verdicts(live=local, trace=parts.trace.diagnoses, live_steps=steady.count,
                          window_steps=parts.trace.window_steps, thresholds=thresholds,
                          steady_step_ms=steady.quantile(0.5) if steady.count >= MIN_STEADY_STEPS else None)


def build_run_report(state: RunState, facts: RunFacts, thresholds: Thresholds, peak_flops: float | None,
                     faults: FaultLog, stalls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report of the run as ``state`` holds it (on any thread); ``stalls``: the live watch's records."""
    stats = state.stats.thaw()
    parts = state.parts
    diagnoses = run_verdicts(stats, parts, thresholds, faults, stalls, facts.framework,
                             accelerator=facts.device.get("type") not in (None, "cpu"),
                             cpus=facts.device.get("usable_cpus"), framework_version=facts.framework_version)
    windows = [dict(window) for window in parts.windows]
    analysed = [w["metrics"] for w in windows if w.get("metrics")]
    try:
        throughput = throughput_section(stats, parts.flops or {}, facts.device, parts.matmul_dtype, peak_flops,
                                        analysed[-1] if analysed else None, diagnoses, parts.token_source,
                                        parts.device_peak)
    except Exception as error:
        faults.report("throughput", error)
        throughput = None
    report = build_report(framework=facts.framework, status=state.status, rank=facts.rank,
                          world_size=facts.world_size, device=facts.device, stats=stats, windows=windows,
                          diagnoses=diagnoses, throughput=throughput, faults=faults.as_list(), error=parts.error,
                          memory=_copy(parts.memory), run=_copy(parts.run), global_step=state.global_step,
                          run_id=facts.run_id, started_at=facts.started_at, compile=_copy(parts.compile),
                          unfinished_steps=parts.unfinished_steps, named_work=dict(parts.named_work or {}) or None,
                          signal=state.signal, device_hour_cost=facts.device_hour_cost)
    if stalls:
        report["stalls"] = stalls
    if parts.missed_windows:
        report["missed_windows"] = [dict(missed) for missed in parts.missed_windows]
    if parts.overhead is not None:
        report["overhead"] = overhead_section(parts.overhead, stats.sampled_steps)
    return report


def overhead_section(overhead: dict[str, Any], sampled_steps: int) -> dict[str, Any]:
    """The report's ``overhead``: the sampler's figures, ``detailed_steps`` as the statistics counted them (the
    steps resolved so far)."""
    section = dict(overhead)
    section["in_place_us"] = dict(section["in_place_us"])
    section["changes"] = [dict(change) for change in section["changes"]]
    section["sampled_steps"] = sampled_steps
    return section


def _copy(section: dict[str, Any] | None) -> dict[str, Any] | None:
    """A report's own copy of a published section (the report may be changed; the state never is)."""
    return dict(section) if section is not None else None
