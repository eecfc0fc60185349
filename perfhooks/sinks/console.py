"""A short table of the report, for the end of training."""

from __future__ import annotations

import sys
from typing import Any

from perfhooks.events import OTHER, PHASES
from perfhooks.report.build import status_line
from perfhooks.report.cost import worth_phrase


def format_table(report: dict[str, Any]) -> str:
    if not report.get("steps"):  # no step completed: a table of zeros would say nothing
        status = status_line(report)
        why = status.split("; the figures")[0] if status else "the run ended"
        return f"perfhooks: no training step completed ({why}); no figures to report"
    step = report["step_ms"]
    lines = [
        f"perfhooks: {report['steps']} steps on {report['device'].get('name', report['device']['type'])} "
        f"({report['framework']}), step {step['mean']:.2f} ms mean, {step['p95']:.2f} ms p95, "
        f"coverage {report['coverage']:.1%}",
        f"  {'phase':<10} {'share':>7} {'mean ms':>10} {'p50 ms':>10} {'p95 ms':>10} {'max ms':>10}",
    ]
    status = status_line(report)
    if status:
        lines.insert(0, f"perfhooks: {status}")
    for name in (*PHASES, OTHER):
        phase = report["phases"][name]
        lines.append(f"  {name:<10} {phase['share']:>7.1%} {phase['mean_ms']:>10.3f} {phase['p50_ms']:>10.3f} "
                     f"{phase['p95_ms']:>10.3f} {phase['max_ms']:>10.3f}")
    overhead = overhead_line(report)
    if overhead:
        lines.append(overhead)
    steady = report.get("steady") or {}
    if steady.get("perfhooks_steps"):
        lines.append(f"  {steady['perfhooks_steps']} step(s) overlapped perfhooks' own work (capture windows, trace "
                     f"export, analysis); the other {steady['steps']}: mean {steady['step_ms']['mean']:.2f} ms, "
                     f"p95 {steady['step_ms']['p95']:.2f} ms")
    run = report.get("run")
    if run and run["wall_s"] > 0:
        lines.append(f"  run {run['wall_s']:.1f} s: training {run['shares']['training']:.1%}, evaluation "
                     f"{run['shares']['evaluation']:.1%} ({run['evaluations']}), checkpointing "
                     f"{run['shares']['checkpointing']:.1%} ({run['checkpoints']}), other {run['shares']['other']:.1%}")
    if run and run.get("compilations"):
        compiled = (report.get("compile") or {}).get("compiled_steps") or []
        lines.append(f"  torch.compile: {run['compiling_s']:.2f} s compiling ({run['compilations']} compilation(s)"
                     f"{', in steps ' + ', '.join(map(str, compiled[:5])) if compiled else ''}), taken out of the "
                     "steps; those steps are left out of the steady figures")
    lines.extend(throughput_lines(report.get("throughput")))
    kept = [w for w in report["windows"] if not w.get("pruned")]
    if kept:
        lines.append(f"  traces: {len(kept)} window(s), latest {kept[-1]['path']} (the 'USDT: ... profiler_start' "
                     "and 'profiler_stop' lines on stderr are torch.profiler's own, printed at each window's start "
                     "and stop)")
    merged = report.get("merged_trace")
    if merged:
        lines.append(f"  all ranks on one timeline: {merged['path']}" if merged.get("path") else
                     f"  all ranks on one timeline: {merged['command']}")
    for diagnosis in report["diagnoses"][:3]:
        gain = worth_phrase(diagnosis)
        lines.append(f"  [{diagnosis['severity']}] {diagnosis['title']}" + (f" (fixing it {gain})" if gain else "")
                     + f": {diagnosis['recommendation']}")
    if report["faults"]:
        lines.append(f"  perfhooks faults (skipped, training unaffected): "
                     f"{', '.join(f['kind'] for f in report['faults'])}")
    return "\n".join(lines)


def overhead_line(report: dict[str, Any]) -> str | None:
    """How many steps the phases come from, and what perfhooks cost (the report's ``overhead``)."""
    overhead = report.get("overhead")
    if not overhead:
        return None
    steps, sampled = report["steps"], report.get("phase_steps", report["steps"])
    budget = overhead.get("budget")
    how = (f"random, budget {budget:.0%}" if budget is not None else "every step")
    cost = overhead.get("in_place_us") or {}
    costs = ", ".join(f"{kind} {cost[kind]:.1f} us" for kind in ("detailed", "light") if cost.get(kind) is not None)
    kept = {True: "within budget", False: "over budget", None: "no budget"}[overhead.get("kept")]
    captures = overhead.get("captures_share") or 0.0
    apart = f"; capture windows and FLOP counts {captures:.2%} more" if captures >= 0.0001 else ""
    measured = overhead.get("measured") or {}
    if measured.get("resolved"):
        cost_text = (f"perfhooks cost {measured['share']:.2%} of the steps, measured on the wall clock (95%: "
                     f"{measured['low']:.2%} to {measured['high']:.2%}; {kept}; in place {costs or 'n/a'}{apart})")
    else:
        cost_text = (f"perfhooks' own time {overhead.get('share_of_run', 0.0):.2%} of the steps ({kept}; a step in "
                     f"place: {costs or 'n/a'}{apart}; in place, a lower bound)")
    where = _where_the_cost_is(overhead, steps) + _windows_time(overhead)
    return f"  phases from {sampled:,} of {steps:,} steps ({how}); {cost_text}{where}"


def _windows_time(overhead: dict[str, Any]) -> str:
    """What the steps that overlapped capture windows and perfhooks' own work (exports, analyses) took beyond a
    steady step, on the wall clock, when it is a tenth of a percent of the steps or more."""
    windows = overhead.get("windows") or {}
    share = windows.get("time_share") or 0.0
    if share < 0.001:
        return ""
    return (f"; the {windows['steps']} steps that overlapped capture windows and their exports took "
            f"{windows['added_s']:.2f} s more than steady steps ({share:.1%} of the steps' time)")


def _where_the_cost_is(overhead: dict[str, Any], steps: int) -> str:
    """Where perfhooks' cost is when it is not in the median step: a run whose steps were all detailed (its
    warm-up, its windows) pays the detailed price on each."""
    detailed = overhead.get("detailed_steps") or 0
    if steps and overhead.get("budget") is not None and detailed >= steps:
        return "; every step detailed, as a run's first 50 are"
    return ""


def fresh_line() -> str:
    """``"\\n"`` while a tqdm progress bar is open on the terminal (the Trainer's, at ``on_train_end``), so the
    table starts on a line of its own; ``""`` otherwise. tqdm is looked at only if the program imported it."""
    tqdm_module = sys.modules.get("tqdm")
    bars = getattr(getattr(tqdm_module, "tqdm", None), "_instances", None)
    try:
        return "\n" if any(not getattr(bar, "disable", True) for bar in list(bars or ())) else ""
    except Exception:  # a tqdm that changed shape: no extra line
        return ""


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


WATERFALL_NAMES = {"compute_beyond_ideal_ms": "device compute beyond ideal", "device_idle_ms": "device idle",
                   "compute_and_idle_ms": "compute and idle (not split)", "data_wait_ms": "exposed data wait",
                   "other_ms": "other"}


def throughput_lines(throughput: dict[str, Any] | None) -> list[str]:
    """The table's throughput and MFU lines: what was measured, and which input is missing for the rest."""
    if not throughput:
        return []
    parts = []
    if throughput.get("samples_per_s") is not None:
        parts.append(f"{throughput['samples_per_s']:,.1f} samples/s")
    if throughput.get("tokens_per_s") is not None:
        parts.append(f"{throughput['tokens_per_s']:,.0f} tokens/s")
    if throughput.get("achieved_flops_per_s") is not None:
        parts.append(f"{_si(throughput['achieved_flops_per_s'], 'FLOP/s')} "
                     f"({_si(throughput['flops_per_step'], 'FLOP')}/step, {throughput['flops_source']})")
    lines = [f"  throughput: {', '.join(parts)}"] if parts else []
    mfu = throughput.get("mfu")
    if mfu is not None:
        line = (f"  MFU {mfu:.1%} of {_si(throughput['peak_flops_per_s'], 'FLOP/s')} "
                f"({throughput['matmul_dtype']}, {throughput['peak_source']})")
        fall = throughput.get("waterfall") or {}
        largest = fall.get("largest")
        if largest and fall.get(largest) is not None:
            line += (f"; largest loss: {WATERFALL_NAMES.get(largest, largest)} {fall[largest]:.2f} of "
                     f"{fall['step_ms']:.2f} ms (ideal {fall['ideal_ms']:.2f} ms)")
            if fall.get("explained_by"):
                line += f", see {fall['explained_by']}"
        lines.append(line)
    elif throughput.get("missing"):
        lines.append(f"  no MFU: {'; '.join(throughput['missing'])}")
    return lines


#: Verdicts the first answer prints (the largest gains first).
EARLY_VERDICTS = 5


def early_lines(report: dict[str, Any], folder: Any) -> str:
    """The run's first answer, before any trace: its verdicts, one line each, the largest gain first (``folder``:
    where the report is)."""
    lines = [f"perfhooks: after {report['steps']} steps, before any trace (the evidence: {folder}/report.json):"]
    for diagnosis in report["diagnoses"][:EARLY_VERDICTS]:
        gain = worth_phrase(diagnosis)
        lines.append(f"  [{diagnosis['severity']}] {diagnosis['title']}" + (f" (fixing it {gain})" if gain else "")
                     + f": {diagnosis['recommendation']}")
    return "\n".join(lines)


def live_line(live: dict[str, Any]) -> str:
    """One line of a running job's figures (a rank's live file): steps, rate, step p50, phase shares,
    throughput, memory, verdicts and a stall."""
    parts = [f"perfhooks: step {live['step']}"]
    if live.get("steps_per_s"):
        parts.append(f"{live['steps_per_s']:.2f} steps/s")
    parts.append(f"step p50 {live['step_p50_ms']:.1f} ms")
    shares = live.get("shares") or {}
    parts.append(" ".join(f"{name} {shares.get(name, 0.0):.0%}" for name in (*PHASES, OTHER)))
    if live.get("samples_per_s"):
        parts.append(f"{live['samples_per_s']:.1f} samples/s")
    if live.get("memory_bytes"):
        parts.append(f"memory {live['memory_bytes'] / 2**30:.2f} GiB")
    verdicts = list(live.get("verdicts") or []) + (["stalled"] if live.get("stalled") else [])
    if verdicts:
        parts.append("verdicts: " + ", ".join(verdicts))
    return "; ".join(parts)
