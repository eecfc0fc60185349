"""The ``perfhooks analyze`` text report: overview, breakdown, top kernels and ranked diagnoses."""

from __future__ import annotations

from typing import Any

from perfhooks.report.cost import worth_phrase


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def format_analysis(report: dict[str, Any], top: int = 5) -> str:
    metrics = report.get("metrics", {})
    source = report.get("source", {})
    lines = [f"perfhooks analyze: {source.get('path', '?')} (rank {report['rank']}, {source.get('events', 0)} events)"]
    if (report.get("ranks") or {}).get("count", 0) > 1:
        lines.append(f"  the figures below are rank {report['rank']}'s (the lowest); each rank's step time is on the "
                     "ranks line, and each verdict names the rank it quotes")
    for warning in source.get("warnings", []):
        lines.append(f"  warning: {warning}")
    step_us = metrics.get("step_us") or 0.0
    lines.append(f"  steps {metrics.get('steps', 0)}, {step_us / 1e3:.2f} ms per step on "
                 f"{report['device'].get('name') or report['device']['type']}")
    occupancy = metrics.get("achieved_occupancy")
    steady = metrics.get("steady") or {}
    judged = ("" if not steady else
              " over the whole window; steady state (less start-up, capture and compilation) "
              + (_pct(steady["gpu_utilization"]) if steady.get("gpu_utilization") is not None else "not judged"))
    lines.append(f"  GPU utilization {_pct(metrics.get('gpu_utilization'))}{judged}, est. SM efficiency "
                 f"{_pct(metrics.get('sm_efficiency'))}, est. achieved occupancy "
                 f"{'n/a' if occupancy is None else f'{occupancy:.1f}%'}")
    breakdown = metrics.get("breakdown") or {}
    if step_us:
        lines.append("  step breakdown (ms per step, share):")
        for role, value in breakdown.items():
            lines.append(f"    {role:<14} {value / 1e3:>9.2f}  {value / step_us:>6.1%}")
    temporal = metrics.get("temporal") or {}
    if temporal:
        idle = metrics.get("idle") or {}
        lines.append(f"  GPU time: idle {_pct(temporal['idle'])}, compute {_pct(temporal['compute'])}, "
                     f"non-compute {_pct(temporal['non_compute'])}; idle is host wait {_pct(idle.get('host_wait'))}, "
                     f"kernel wait {_pct(idle.get('kernel_wait'))}, other {_pct(idle.get('other'))}")
    ranks = report.get("ranks")
    if ranks:
        per_rank = ", ".join(f"rank {k}: {v:.1f} ms" for k, v in ranks["step_ms"].items())
        lines.append(f"  {ranks['count']} ranks, step time {per_rank} (spread {ranks['spread']:.1%})")
    lines.extend(gemm_lines(metrics.get("gemm")))
    kernels = (metrics.get("kernels") or {}).get("top") or []
    if kernels:
        lines.append("  top kernels:")
        for kernel in kernels[:top]:
            lines.append(f"    {kernel['share']:>6.1%} {kernel['total_us'] / 1e3:>9.2f} ms x{kernel['count']:<5} "
                         f"{kernel['name'][:90]}")
    lines.append(f"  diagnoses ({len(report['diagnoses'])}):" if report["diagnoses"] else "  no diagnoses fired")
    for index, diagnosis in enumerate(report["diagnoses"], 1):
        gain = worth_phrase(diagnosis)
        lines.append(f"  {index}. [{diagnosis['severity']}] {diagnosis['id']}: {diagnosis['title']}"
                     + (f" (fixing it {gain})" if gain else ""))
        lines.append(f"     evidence: {diagnosis['evidence']}")
        lines.append(f"     fix: {diagnosis['recommendation']}")
    return "\n".join(lines)


def gemm_lines(gemm: dict[str, Any] | None, top: int = 3) -> list[str]:
    """The GEMMs' achieved TFLOP/s against the device's peak, overall and for the top ones by device time."""
    if not gemm:
        return []
    efficiency = gemm.get("efficiency")
    against = (f", {efficiency:.1%} of the {gemm['dtype']} peak {gemm['peak_tflops']:g} TFLOP/s"
               if efficiency is not None and gemm.get("peak_tflops") else f" ({gemm.get('missing', 'no peak')})")
    lines = [f"  GEMMs: {gemm['gemms']} ops, {gemm['flops'] / 1e12:.3f} TFLOP in {gemm['device_us'] / 1e3:.2f} ms: "
             f"{gemm['achieved_tflops']:.1f} TFLOP/s{against}"]
    for row in gemm.get("top", [])[:top]:
        share = f", {row['efficiency']:.1%} of peak" if row.get("efficiency") is not None else ""
        lines.append(f"    {row['achieved_tflops']:>8.1f} TFLOP/s{share}  x{row['count']:<4} {row['name']} "
                     f"{row['dtype']} {row['input_shapes'][:70]}")
    return lines
