"""A self-contained HTML page of a report: no scripts, fonts or images fetched, only inline CSS and SVG."""

from __future__ import annotations

import html
from typing import Any

COLORS = {"kernel": "#2e86de", "memcpy": "#e67e22", "memset": "#f1c40f", "communication": "#8e44ad",
          "runtime": "#16a085", "dataloader": "#e8a317", "cpu_exec": "#7f8c8d", "other": "#bdc3c7",
          "data_wait": "#e8a317", "forward": "#2e86de", "backward": "#8e44ad", "optimizer": "#27ae60",
          "training": "#2e86de", "evaluation": "#16a085", "checkpointing": "#c0392b"}
#: The per-step series that are phase times (the others label the steps).
PHASE_SERIES = ("data_wait", "forward", "backward", "optimizer", "other")
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1040px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}
.diag{border-left:6px solid #999;padding:6px 12px;margin:10px 0;background:#fafafa}
.critical{border-color:#c0392b}.warning{border-color:#e67e22}.info{border-color:#5dade2}
.legend span{display:inline-block;margin-right:12px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
code{background:#f0f0f0;padding:1px 3px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _legend(items: dict[str, str]) -> str:
    """A colour swatch and the name for each series, with an optional figure after the name."""
    return "".join(f'<span><i class="sw" style="background:{COLORS.get(n, "#999")}"></i>{_e(n)}'
                   f'{" " + note if note else ""}</span>' for n, note in items.items())


def _stacked_bar(parts: dict[str, float], width: int = 1000, height: int = 28) -> str:
    total = sum(v for v in parts.values() if v > 0)
    if not total:
        return "<p>no step time</p>"
    x = 0.0
    rects = []
    for name, value in parts.items():
        if value <= 0:
            continue
        w = width * value / total
        rects.append(f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{height}" fill="{COLORS.get(name, "#999")}">'
                     f"<title>{_e(name)}: {value / total:.1%}</title></rect>")
        x += w
    legend = _legend({n: f"{v / total:.1%}" for n, v in parts.items() if v > 0})
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="step breakdown">{"".join(rects)}</svg>'
            f'<div class="legend">{legend}</div>')


def _scale(values: list[float]) -> float:
    """A y-axis top that keeps steady state readable: the 98th percentile plus 10%, not a warm-up spike."""
    ordered = sorted(values)
    return min(ordered[-1], ordered[int(0.98 * (len(ordered) - 1))] * 1.1) or ordered[-1]


def _y(value: float, top: float, height: int) -> str:
    return f"{height - height * min(value, top) / top:.1f}"


def _series(series: dict[str, list[float]], width: int = 1000, height: int = 180) -> str:
    values = [v for points in series.values() for v in points]
    if not values or max(values) <= 0:
        return "<p>no per-step phase times</p>"
    top = _scale(values)
    lines = []
    for name, points in series.items():
        if len(points) < 2:
            continue
        step = width / (len(points) - 1)
        coords = " ".join(f"{i * step:.1f},{_y(v, top, height)}" for i, v in enumerate(points))
        lines.append(f'<polyline fill="none" stroke="{COLORS.get(name, "#999")}" stroke-width="1.5" '
                     f'points="{coords}"><title>{_e(name)}</title></polyline>')
    legend = _legend(dict.fromkeys(series, ""))
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="phase time series">{"".join(lines)}</svg>'
            f'<div class="legend">{legend} (axis top {top:.2f} ms; max {max(values):.2f} ms)</div>')


def _stacked_series(series: dict[str, list[float]], width: int = 1000, height: int = 180) -> str:
    """Phase times stacked per step (an area per phase): how the step's time splits, step by step."""
    names = [n for n, points in series.items() if len(points) >= 2]
    if not names:
        return ""
    count = min(len(series[n]) for n in names)
    totals = [sum(series[n][i] for n in names) for i in range(count)]
    top = _scale(totals) if totals else 0.0
    if count < 2 or top <= 0:
        return ""
    dx = width / (count - 1)
    base = [0.0] * count
    areas = []
    for name in names:
        upper = [base[i] + series[name][i] for i in range(count)]
        points = [f"{i * dx:.1f},{_y(upper[i], top, height)}" for i in range(count)]
        points += [f"{i * dx:.1f},{_y(base[i], top, height)}" for i in reversed(range(count))]
        areas.append(f'<polygon fill="{COLORS.get(name, "#999")}" fill-opacity="0.85" points="{" ".join(points)}">'
                     f"<title>{_e(name)}</title></polygon>")
        base = upper
    legend = _legend(dict.fromkeys(names, ""))
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="stacked phase breakdown">'
            f'{"".join(areas)}</svg><div class="legend">{legend} (axis top {top:.2f} ms per step; '
            f'max {max(totals):.2f} ms)</div>')


def _memory_line(memory: dict[str, Any], width: int = 1000, height: int = 140) -> str:
    """Used memory per sample against the capacity (GiB), with the peak."""
    series = memory.get("series") or {}
    used = series.get("used_bytes") or []
    capacity = memory.get("capacity_bytes") or 0
    gib = 2**30
    text = (f"<p>peak {memory.get('peak_used_bytes', 0) / gib:.2f} GiB at step {_e(memory.get('peak_step'))} "
            f"({_e(memory.get('peak_phase'))})" + (f" of {capacity / gib:.2f} GiB ({_e(memory.get('limit'))})"
                                                  if capacity else "") + f"; device {_e(memory.get('device'))}</p>")
    if len(used) < 2:
        return text
    top = max(max(used), capacity or 0) * 1.05
    dx = width / (len(used) - 1)
    coords = " ".join(f"{i * dx:.1f},{height - height * u / top:.1f}" for i, u in enumerate(used))
    limit = ""
    if capacity:
        y = height - height * capacity / top
        limit = f'<line x1="0" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#c0392b" stroke-dasharray="6 4"/>'
    steps = series.get("step") or [0]
    return (text + f'<svg width="{width}" height="{height}" role="img" aria-label="memory used">{limit}'
            f'<polyline fill="none" stroke="#2c3e50" stroke-width="1.5" points="{coords}"/></svg>'
            f'<div class="legend">used memory, steps {steps[0]}–{steps[-1]}; dashed: capacity</div>')


def render_html(report: dict[str, Any], series: dict[str, list[float]] | None = None) -> str:
    """The report as one HTML page: the diagnoses first, then the step breakdown (mean and stacked per
    step), per-phase series, the memory line, top kernels and links to the traces."""
    metrics = report.get("metrics") or {}
    breakdown = metrics.get("breakdown") or {name: p["mean_ms"] for name, p in report["phases"].items()}
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>perfhooks report</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>perfhooks: {_e(report['framework'])} on {_e(report['device'].get('name', ''))}</h1>",
             f"<p>{report['steps']} steps, step time mean {report['step_ms']['mean']:.2f} ms, "
             f"p95 {report['step_ms']['p95']:.2f} ms; rank {report['rank']} of {report['world_size']}</p>",
             '<h2 id="diagnoses">Diagnoses</h2>']
    if not report["diagnoses"]:
        parts.append("<p>No diagnosis fired.</p>")
    for diagnosis in report["diagnoses"]:
        parts.append(
            f'<div class="diag {_e(diagnosis["severity"])}"><b>{_e(diagnosis["title"])}</b> '
            f'<code>{_e(diagnosis["id"])}</code> [{_e(diagnosis["severity"])}], up to '
            f'{diagnosis.get("estimated_gain", 0):.0%} of step time<br>Evidence: {_e(diagnosis["evidence"])}<br>'
            f'Fix: {_e(diagnosis["recommendation"])}'
            + (f' (<a href="{_e(diagnosis["docs"])}">docs</a>)' if diagnosis.get("docs") else "") + "</div>")
    run = report.get("run")
    if run:
        parts += [f"<h2>Where the run's time went</h2><p>{run['wall_s']:.2f} s from the first step to the end: "
                  f"{run['evaluations']} evaluation(s), {run['checkpoints']} checkpoint write(s)</p>",
                  _stacked_bar({"training": run["training_s"], "evaluation": run["evaluation_s"],
                                "checkpointing": run["checkpointing_s"], "other": run["other_s"]})]
    parts += ["<h2>Step breakdown</h2>", _stacked_bar(breakdown)]
    if series:
        phases = {name: series[name] for name in PHASE_SERIES if name in series}
        steps = [s for s in series.get("global_step") or [] if s is not None]
        axis = f'<div class="legend">steps {steps[0]}–{steps[-1]} (the framework\'s step)</div>' if steps else ""
        parts += ["<h2>Phases per step, stacked (ms)</h2>", _stacked_series(phases), axis,
                  "<h2>Phases per step (ms)</h2>", _series(phases), axis]
    if report.get("memory"):
        parts += ['<h2 id="memory">Memory</h2>', _memory_line(report["memory"])]
    kernels = (metrics.get("kernels") or {}).get("top") or []
    if kernels:
        parts.append("<h2>Top kernels</h2><table><tr><th>share</th><th>ms</th><th>count</th><th>kernel</th></tr>")
        for kernel in kernels:
            parts.append(f"<tr><td>{kernel['share']:.1%}</td><td>{kernel['total_us'] / 1e3:.2f}</td>"
                         f"<td>{kernel['count']}</td><td>{_e(kernel['name'][:120])}</td></tr>")
        parts.append("</table>")
    windows = [w for w in report.get("windows", []) if not w.get("pruned")]
    if windows:
        parts.append("<h2>Traces</h2><ul>")
        for window in windows:
            parts.append(f'<li><a href="{_e(window["path"])}">{_e(window["path"])}</a> steps '
                         f'{window["first_step"]}–{window["last_step"]}</li>')
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
