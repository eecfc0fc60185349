"""Parse once, analyse many: every analyzer over a trace, then the diagnoses, as a report document."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import statistics
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from perfhooks.analysis import spans
from perfhooks.analysis.gemm import gemm_efficiency
from perfhooks.analysis.host import compilation, host_synchronizations, sync_tail_section, unrecorded_section
from perfhooks.analysis.kernels import (
    attention_core,
    attention_kernels,
    kernel_breakdown,
    launch_statistics,
    sdpa_math_inputs,
    startup_work,
    stream_breakdown,
    tensor_core_use,
)
from perfhooks.analysis.operators import eligible_precision, misaligned_gemms, top_operators
from perfhooks.analysis.overview import Overview, compute_overview, lead_in_us, step_rule
from perfhooks.analysis.steady import device_queueing, steady_state
from perfhooks.analysis.temporal import idle_breakdown, temporal_breakdown
from perfhooks.analysis.trace import NotATrace, Trace, TraceError, load_traces
from perfhooks.analysis.trace_files import find_traces
from perfhooks.analysis.transfers import communication_summary, memcpy_summary
from perfhooks.events import PHASES
from perfhooks.report.build import build_report
from perfhooks.report.merge import merge_summaries, rank_summary
from perfhooks.report.statistics import PhaseStatistics, StepTiming
from perfhooks.rules.pipeline import merge_verdicts, name_ranks
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.trace import diagnose_trace
from perfhooks.rules.verdicts import Diagnosis


def trace_metrics(trace: Trace, overview: Overview | None = None) -> dict[str, Any]:
    """Every analyzer's output for one trace (the ``metrics`` section of the report)."""
    overview = overview or compute_overview(trace)
    steps = overview.step_count or len(overview.steps)  # a partial last step weighs its recorded micro-batches
    window = spans.merge((start, end) for _, start, end in overview.steps)
    devices = sorted(overview.gpu_utilization)
    first = devices[0] if devices else None
    step_spans = [end - start for _, start, end in overview.steps]
    p50 = statistics.median(step_spans) if step_spans else 0.0
    # what ran in the steps: a window of perfhooks' holds evaluation and checkpoints between its steps
    in_steps = trace.within(window) if window else trace
    communication = communication_summary(trace, window)
    metrics: dict[str, Any] = {
        "steps": steps,
        "step_rule": step_rule(trace),
        # a step-less window's idle lead-in (the profiler's start before the first operator): said, not counted
        "lead_in_us": round(lead_in_us(trace), 3),
        "step_us": overview.step_us,
        "gpu_utilization": overview.gpu_utilization.get(first) if first is not None else None,
        "sm_efficiency": overview.sm_efficiency.get(first) if first is not None else None,
        "achieved_occupancy": overview.achieved_occupancy.get(first) if first is not None else None,
        "breakdown": overview.breakdown_us,
        "devices": {str(d): {"name": trace.device_name(d), "gpu_utilization": overview.gpu_utilization[d],
                             "sm_efficiency": overview.sm_efficiency[d],
                             "achieved_occupancy": overview.achieved_occupancy[d]} for d in devices},
        "temporal": temporal_breakdown(trace, window),
        "idle": idle_breakdown(trace, window),
        "kernels": kernel_breakdown(in_steps),
        "streams": stream_breakdown(in_steps),
        "tensor_cores": tensor_core_use(in_steps),
        "eligible_precision": eligible_precision(in_steps),
        # a device-bound trace's steps are found on the device, where the host ran ahead of them: its operators
        # lie before the steps' spans, and are read from the whole trace (priced by the device time they launched)
        "attention": attention_kernels(in_steps if in_steps.cpu_ops or not trace.has_gpu else trace),
        "attention_core": attention_core(in_steps if in_steps.cpu_ops or not trace.has_gpu else trace),
        "sdpa_math": sdpa_math_inputs(in_steps),
        "compile": compilation(trace),
        "host_sync": host_synchronizations(trace, steps),
        # device time the trace does not record: a synchronize that waited far longer than the work it shows
        "unrecorded": unrecorded_section(trace),
        "sync_tail": sync_tail_section(trace),
        "launch": launch_statistics(trace, steps, window),
        "startup": startup_work(trace, window),
        # the window less start-up work and graph captures: what the steady-state rules are judged on
        "steady": steady_state(trace, window, steps, first),
        "queueing": device_queueing(trace, window, first),
        "memcpy": memcpy_summary(trace, steps),
        "communication": communication,
        # the time in collectives per step (the wait for the other ranks is inside it): the straggler rule's input
        "collective_ms_per_step": (communication["share"] * overview.step_us / 1e3 if communication else None),
        "top_operators": top_operators(in_steps),
        "gemm": gemm_efficiency(in_steps),
        "misaligned_gemms": misaligned_gemms(in_steps),
        "step_us_p50": p50,
        "step_us_p95_over_p50": (_quantile(step_spans, 0.95) / p50) if p50 and len(step_spans) >= 5 else None,
    }
    return metrics


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def phase_statistics(trace: Trace, steps: list[tuple[int, float, float]]) -> PhaseStatistics:
    """Per-step phase times from perfhooks' own labels in the trace (zeros when the trace has none)."""
    stats = PhaseStatistics()
    labels = sorted((a for a in trace.annotations if a.name in PHASES), key=lambda a: a.ts)
    i = 0
    for number, start, end in steps:
        phase_ms: dict[str, float] = {}
        while i < len(labels) and labels[i].ts < start:
            i += 1
        j = i
        while j < len(labels) and labels[j].ts < end:
            name = labels[j].name
            phase_ms[name] = phase_ms.get(name, 0.0) + labels[j].dur / 1e3
            j += 1
        step_ms = (end - start) / 1e3
        phase_ms["other"] = max(0.0, step_ms - sum(phase_ms.values()))
        stats.add(StepTiming(number, step_ms, phase_ms, 1 if phase_ms.get("forward") else 0, global_step=number))
    return stats


def analyze_trace(trace: Trace, thresholds: Thresholds | None = None, last_step_share: float | None = None
                  ) -> dict[str, Any]:
    """A version-1 report for one trace: the metrics, and the diagnoses ranked by estimated gain.
    ``last_step_share``: the share 0..1 of its micro-batches the trace's last step holds (a window that stopped
    inside it); the per-step figures weigh it so."""
    overview = compute_overview(trace)
    if last_step_share is not None:
        overview.weigh_last(last_step_share)
    metrics = trace_metrics(trace, overview)
    stats = phase_statistics(trace, overview.steps)
    devices = metrics["devices"]
    if devices:
        device = {"type": "cuda", "name": next(iter(devices.values()))["name"]}
    elif trace.unmodeled:  # activity of a device perfhooks does not model: never called "cpu"
        device = {"type": "unknown", "name": f"a device perfhooks does not model ({', '.join(trace.unmodeled)})"}
    elif _listed_gpus(trace):  # the machine had a GPU, and the trace recorded none of its activity
        device = {"type": "not_recorded",
                  "name": f"{_listed_gpus(trace)[0]} (listed; its activity was not recorded)"}
    else:
        device = {"type": "cpu", "name": "cpu"}
    report = build_report(framework="trace", status="completed", rank=trace.rank or 0,
                          world_size=trace.world_size or 1, device=device, stats=stats, windows=[],
                          diagnoses=merge_verdicts(trace=diagnose_trace(metrics, thresholds or Thresholds())))
    report["source"] = {"path": trace.path, "events": trace.events, "warnings": trace.warnings}
    report["warnings"] = list(trace.warnings) + _coverage_warnings(trace, metrics)
    if not any(t.phase_ms.get("forward") for t in stats.recent):
        report["series"] = {}  # no perfhooks labels in the trace: no per-phase series
    report["metrics"] = metrics
    return report


def _listed_gpus(trace: Trace) -> list[str]:
    """The GPU names ``deviceProperties`` lists, when the trace holds no device event and no launch."""
    if trace.has_gpu or any("Launch" in (call.name or "") for call in trace.runtimes):
        return []
    return [str(props.get("name")) for props in trace.device_properties.values() if props.get("name")]


def _coverage_warnings(trace: Trace, metrics: dict[str, Any]) -> list[str]:
    """What the trace lacks that its figures depend on (said once, so that absent figures are not misread)."""
    out = []
    listed = _listed_gpus(trace)
    if listed:
        out.append(f"the machine lists {len(listed)} GPU(s) ({listed[0]}), but the trace holds no device activity "
                   "and no kernel launch: ProfilerActivity.CUDA was off (or the work ran on the CPU); the figures "
                   "are the host's, and nothing is said about the GPU")
    launches = sum(1 for call in trace.runtimes if "Launch" in (call.name or ""))
    if launches and not trace.kernels:
        out.append(f"{launches} kernel launches but no kernel events: device activity was not recorded "
                   "(ProfilerActivity.CUDA off, or CUPTI busy with counters); device figures are absent")
    elif metrics["gpu_utilization"] == 0.0:
        out.append("no kernel ran inside the steps: device activity there was not recorded, or the steps "
                   "launched none; GPU utilization is not judged")
    return out


def _analyze_file(path: str, thresholds: Thresholds | None = None, last_step_share: float | None = None
                  ) -> list[dict[str, Any]]:
    """One report per rank in the file: one, or a merged trace's ranks."""
    with _no_cyclic_gc():
        return [analyze_trace(trace, thresholds, last_step_share) for trace in load_traces(path)]


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a trace is parsed and analysed.

    A trace becomes millions of objects with no reference cycles; the collector would walk them
    again and again as they are allocated (about 20% of the time on a 600k-event trace).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def analyze_paths(paths: list[str | Path], workers: int | None = None,
                  thresholds: Thresholds | None = None, last_step_share: float | None = None) -> dict[str, Any]:
    """Analyse files or folders; several traces are one multi-rank run, analysed in parallel processes.
    ``last_step_share``: a single trace's last step holds that share of its micro-batches (see
    :func:`analyze_trace`)."""
    files = find_traces(paths)
    if len(files) == 1:
        results = [_analyze_file(files[0], thresholds, last_step_share)]
    else:
        workers = workers or min(len(files), os.cpu_count() or 1)
        if workers > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                results = list(pool.map(_analyze_or_skip, files, [thresholds] * len(files)))
        else:
            results = [_analyze_or_skip(f, thresholds) for f in files]
    reports = [r for result in results if isinstance(result, list) for r in result]
    skipped = [r for r in results if isinstance(r, str)]
    if len(results) == 1 and len(reports) == 1:
        return reports[0]
    if not reports:
        raise TraceError(f"{', '.join(map(str, paths))}: no trace among the files found ({skipped[0]})")
    merged = merge_ranks(reports, thresholds) if len(reports) > 1 else reports[0]
    merged["warnings"] = [*merged.get("warnings", []), *(f"skipped: {note}" for note in skipped)]
    return merged


def _analyze_or_skip(path: str, thresholds: Thresholds | None = None) -> list[dict[str, Any]] | str:
    """A file's report, or the one-line reason it is not a trace (other JSON in a folder is skipped)."""
    try:
        return _analyze_file(path, thresholds)
    except NotATrace as error:
        return str(error)


def merge_ranks(reports: list[dict[str, Any]], thresholds: Thresholds | None = None) -> dict[str, Any]:
    """One run from per-rank trace reports: the run's own merge (:func:`perfhooks.report.merge.merge_summaries`),
    with every rank's trace diagnoses kept."""

    by_rank = sorted(reports, key=lambda r: r["rank"])
    for first, second in itertools.pairwise(by_rank):
        if first["rank"] == second["rank"]:
            raise TraceError(f"{first['source']['path']} and {second['source']['path']} are both rank "
                             f"{first['rank']}: analyse one trace per rank (one window of one run) at a time")
    expected = max(len(by_rank), *(r.get("world_size") or 1 for r in by_rank))
    return merge_summaries(by_rank[0], [rank_summary(r) for r in by_rank], thresholds, "traces", expected,
                           diagnoses=ranked_diagnoses(by_rank))


def ranked_diagnoses(reports: list[dict[str, Any]]) -> list[Diagnosis]:
    """Every rank's trace diagnoses, each naming the rank whose figures it quotes (:func:`name_ranks`)."""
    return name_ranks([(report["rank"], report["diagnoses"]) for report in reports])
