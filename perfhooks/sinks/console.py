"""A short table of the report, for the end of training."""

from __future__ import annotations

from typing import Any

from perfhooks.phases import OTHER, PHASES


def format_table(report: dict[str, Any]) -> str:
    step = report["step_ms"]
    lines = [
        f"perfhooks: {report['steps']} steps on {report['device'].get('name', report['device']['type'])} "
        f"({report['framework']}), step {step['mean']:.2f} ms mean, {step['p95']:.2f} ms p95, "
        f"coverage {report['coverage']:.1%}",
        f"  {'phase':<10} {'share':>7} {'mean ms':>10} {'p50 ms':>10} {'p95 ms':>10} {'max ms':>10}",
    ]
    for name in (*PHASES, OTHER):
        phase = report["phases"][name]
        lines.append(f"  {name:<10} {phase['share']:>7.1%} {phase['mean_ms']:>10.3f} {phase['p50_ms']:>10.3f} "
                     f"{phase['p95_ms']:>10.3f} {phase['max_ms']:>10.3f}")
    kept = [w for w in report["windows"] if not w.get("pruned")]
    if kept:
        lines.append(f"  traces: {len(kept)} window(s), latest {kept[-1]['path']}")
    for diagnosis in report["diagnoses"][:3]:
        lines.append(f"  [{diagnosis['severity']}] {diagnosis['title']}: {diagnosis['recommendation']}")
    if report["faults"]:
        lines.append(f"  perfhooks faults (skipped, training unaffected): "
                     f"{', '.join(f['kind'] for f in report['faults'])}")
    return "\n".join(lines)
