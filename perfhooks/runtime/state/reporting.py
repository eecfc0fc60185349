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
from perfhooks.rules.pipeline import fitted_to_run, merge_verdicts
from perfhooks.rules.recipe import diagnose_recipe
from perfhooks.rules.settings import PHASE_VERDICTS, diagnose_settings, host_shared, module_not_called
from perfhooks.rules.stalls import diagnose_stalls
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import Diagnosis
from perfhooks.runtime.state.run_state import ReportParts, RunFacts, RunState, TraceVerdicts
from perfhooks.runtime.step.cost_meter import overhead_section, windows_cost
from perfhooks.runtime.throughput.flop_arming import device_peak

#: Steady steps the run needs before its median step judges a window's utilization (more than a window holds).
MIN_STEADY_STEPS = 8


def local_verdicts(stats: PhaseStatistics, parts: ReportParts, thresholds: Thresholds,
                   framework: str | None = None, accelerator: bool = True,
                   cpus: int | None = None, framework_version: str | None = None,
                   device_type: str = "cpu", world_size: int = 1) -> list[Diagnosis]:
    """The verdicts this rank's own figures give: the settings audit, live phase timings, compile counts, memory
    (not yet the trace's). ``cpus``: the CPUs this process may use; ``framework_version``: the framework's
    installed version."""
    return [*diagnose_settings(parts.settings, stats, thresholds, framework=framework, device_type=device_type,
                               world_size=world_size, matmul_dtype=parts.matmul_dtype, run=parts.run),
            *diagnose_recipe(parts.recipe, stats, parts.memory_figures, parts.run, parts.settings, thresholds),
            *diagnose_live(stats, thresholds, compiled=parts.compiled_in_run, run=parts.run,
                           named_work=parts.named_work, framework=framework, accelerator=accelerator, cpus=cpus,
                           framework_version=framework_version, length_grouped=parts.length_grouped,
                           host_share=host_shared(parts.settings, thresholds), recipe=parts.recipe),
            *diagnose_compile(parts.compile, parts.run, thresholds),
            *(diagnose_memory(parts.memory_figures, thresholds) if parts.memory_figures is not None else [])]


def run_verdicts(stats: PhaseStatistics, parts: ReportParts, thresholds: Thresholds, faults: FaultLog,
                 stalls: list[dict[str, Any]] | None = None, framework: str | None = None,
                 accelerator: bool = True, cpus: int | None = None,
                 framework_version: str | None = None, device_type: str = "cpu",
                 world_size: int = 1) -> list[Diagnosis]:
    """Every verdict of the run so far, merged (a fault in a rule is reported once; the trace's verdicts stand)."""
    try:
        local = (local_verdicts(stats, parts, thresholds, framework, accelerator, cpus, framework_version,
                                device_type, world_size)
                 + diagnose_stalls(stalls or []))
        if parts.module_not_called:  # no phase was seen: no verdict is drawn from them
            local = [d for d in local if d["id"] not in PHASE_VERDICTS] + [module_not_called(parts.module_not_called)]
    except Exception as error:
        faults.report("live_diagnoses", error)
        local = []
    steady = stats.steady_step
    merged = merge_verdicts(live=local, trace=parts.trace.diagnoses, live_steps=steady.count,
                            window_steps=parts.trace.window_steps, thresholds=thresholds,
                            steady_step_ms=steady.quantile(0.5) if steady.count >= MIN_STEADY_STEPS else None)
    return fitted_to_run(merged, framework=framework, accelerator=accelerator, cpus=cpus, device_type=device_type,
                         matmul_dtype=parts.matmul_dtype[0])


def build_run_report(state: RunState, facts: RunFacts, thresholds: Thresholds, peak_flops: float | None,
                     faults: FaultLog, stalls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report of the run as ``state`` holds it (on any thread); ``stalls``: the live watch's records."""
    stats = state.stats.thaw()
    parts = state.parts
    diagnoses = run_verdicts(stats, parts, thresholds, faults, stalls, facts.framework,
                             accelerator=facts.device.get("type") not in (None, "cpu"),
                             cpus=facts.device.get("usable_cpus"), framework_version=facts.framework_version,
                             device_type=str(facts.device.get("type") or "cpu"), world_size=facts.world_size)
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
    if parts.settings is not None:
        report["settings"] = _copy(parts.settings)
    if parts.recipe is not None:
        report["recipe"] = {key: value for key, value in parts.recipe.items() if key != "spell"}
    if parts.missed_windows:
        report["missed_windows"] = [dict(missed) for missed in parts.missed_windows]
    if parts.overhead is not None:
        report["overhead"] = overhead_section(parts.overhead, stats.sampled_steps)
        report["overhead"]["windows"] = windows_cost(windows, stats)
    return report


def _copy(section: dict[str, Any] | None) -> dict[str, Any] | None:
    """A report's own copy of a published section (the report may be changed; the state never is)."""
    return dict(section) if section is not None else None


def report_parts(listener: Any, device: dict[str, Any], cuda: bool, error: dict[str, Any] | None,
                 trace: TraceVerdicts) -> ReportParts:
    """The report's slower-changing parts, taken now from the run's parts (``listener``: the step listener, which
    holds them; training thread), each guarded."""
    tracker, memory, faults, flops, capture = (listener.tracker, listener.memory, listener.faults, listener.flops,
                                               listener.capture)
    stats = tracker.stats
    steps = stats.steps  # folds the steps waiting: the totals below are read after
    dtype = flops.matmul_dtype(cuda)
    return ReportParts(
        run=tracker.account.section(stats.training_ms), named_work=tracker.named_work_per_step(),
        compile=faults.call("compile_report", listener.compile.section),
        compiled_in_run=listener.compile.compiled_in_run(),
        memory=faults.call("memory_report", memory.section) if memory is not None else None,
        memory_figures=faults.call("memory_report", memory.figures) if memory is not None else None,
        flops=flops.flops(stats.sampled_steps if steps else 0, stats.samples, stats.padded_tokens or stats.tokens),
        matmul_dtype=dtype, device_peak=device_peak(device, dtype[0]), token_source=tracker.batches.token_source,
        faults=tuple(faults.as_list()), error=dict(error) if error else None,
        unfinished_steps=tracker.pending.unfinished, windows=tuple(capture.windows.snapshot()), trace=trace,
        missed_windows=tuple(dict(m) for m in capture.missed),
        overhead=faults.call("overhead_report", tracker.sampler.section),
        length_grouped=(listener.recipe or {}).get("length_grouped"),
        module_not_called=listener.module_not_called,
        settings=(faults.call("settings_audit", lambda: listener.settings.read(tracker.step, capture.is_open,
                                                                              _micro_batch_rows(stats)))
                  if listener.settings is not None else None),
        recipe=dict(listener.recipe) if listener.recipe is not None else None)


def _micro_batch_rows(stats: Any) -> int:
    """The rows a micro-batch's matmuls take (token slots, padding included, else samples, a micro-batch over the
    detailed steps); 0
    before any was counted."""
    timings = [timing for timing in stats.recent if timing.micro_batches]
    micro = sum(timing.micro_batches for timing in timings)
    rows = sum(timing.padded_tokens or timing.tokens or timing.samples for timing in timings)
    return rows // micro if micro else 0
