"""A self-contained HTML page of a report: no scripts, fonts or images fetched, only inline CSS and SVG."""

from __future__ import annotations

import html
import itertools
import math
import os
import statistics
from pathlib import Path
from typing import Any
from urllib.parse import quote

from perfhooks.report.build import status_line
from perfhooks.report.cost import worth_phrase
from perfhooks.sinks.console import overhead_line

COLORS = {"kernel": "#2e86de", "memcpy": "#e67e22", "memset": "#f1c40f", "communication": "#8e44ad",
          "runtime": "#16a085", "dataloader": "#e8a317", "cpu_exec": "#7f8c8d", "other": "#bdc3c7",
          "data_wait": "#e8a317", "forward": "#2e86de", "backward": "#8e44ad", "optimizer": "#27ae60",
          "training": "#2e86de", "evaluation": "#16a085", "checkpointing": "#c0392b", "compiling": "#7f8c8d",
          "ideal": "#27ae60", "device compute beyond ideal": "#2e86de", "device idle": "#c0392b",
          "compute and idle (not split)": "#7f8c8d", "exposed data wait": "#e8a317"}
#: The per-step series that are phase times (the others label the steps).
PHASE_SERIES = ("data_wait", "forward", "backward", "optimizer", "other")
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1040px;padding:0 16px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;max-width:100%}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee;
overflow-wrap:anywhere}
.diag{border-left:6px solid #999;padding:6px 12px;margin:10px 0;background:#fafafa}
.critical{border-color:#c0392b}.warning{border-color:#e67e22}.info{border-color:#5dade2}
.legend span{display:inline-block;margin-right:12px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
code{background:#f0f0f0;padding:1px 3px}
.status{border:2px solid #c0392b;background:#fdecea;padding:8px 12px;margin:10px 0}
"""


#: What a trace's breakdown roles are, in the phases' words.
TRACE_ROLES = ("From the trace: each moment of a step goes to the first role that covers it: device work (kernel, "
               "memcpy, memset, communication), then runtime calls, then dataloader (the DataLoader's __next__: the "
               "data_wait phase), then cpu_exec (host operators with nothing on the device: the host side of "
               "forward, backward and optimizer); other is what nothing covers.")


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
    return _svg(width, height, "step breakdown", "".join(rects)) + f'<div class="legend">{legend}</div>'


def _scale(values: list[float]) -> float:
    """A y-axis top that keeps steady state readable: the 98th percentile plus 10%, not a warm-up spike."""
    ordered = sorted(values)
    return min(ordered[-1], ordered[int(0.98 * (len(ordered) - 1))] * 1.1) or ordered[-1]


#: Plot margins inside a chart's SVG (px): room for the y ticks on the left and the x ticks below.
LEFT, BOTTOM, TOP_PAD = 72, 22, 6


def _y(value: float, top: float, height: int) -> str:
    return f"{TOP_PAD + (height - TOP_PAD) * (1 - min(value, top) / top):.1f}"


def _clipped(values: list[float], top: float, xs: list[float], color: str, label: str, axis: list[Any]) -> list[str]:
    """A marker (▲ at the top edge, with its value in the tooltip) for each value above the axis top ``top``:
    a clipped outlier is never drawn as if it were the top."""
    out = []
    for i, value in enumerate(values):
        if value > top and i < len(xs):
            x = xs[i]
            step = axis[i] if i < len(axis) else i
            out.append(f'<path d="M{x - 4:.1f},{TOP_PAD + 7} L{x + 4:.1f},{TOP_PAD + 7} L{x:.1f},{TOP_PAD} Z" '
                       f'fill="{color}" stroke="#000" stroke-width="0.5"><title>step {_e(step)}: {_e(label)} '
                       f'{value:.2f} ms, above the axis top {top:.2f} ms</title></path>')
    return out


def _above(count: int, top: float) -> str:
    return f"; {count} value(s) above the axis top {top:.2f} ms, marked ▲" if count else ""


def nice_step(span: float, most: int) -> float:
    """The smallest 1-2-5 step (1, 2, 5, 10, 20, ...) that covers ``span`` in at most ``most`` steps."""
    if span <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(span / most))
    for factor in (1, 2, 5, 10, 20):
        if span / (factor * magnitude) <= most + 1e-9:
            return factor * magnitude
    return 50 * magnitude


def nice_top(top: float, most: int = 5) -> tuple[float, float]:
    """``(axis top, tick step)``: ``top`` rounded up to a whole number of 1-2-5 steps, at most ``most`` of them."""
    step = nice_step(top, most)
    return math.ceil(top / step - 1e-9) * step, step


def _axes(plot_width: int, height: int, top: float, unit: str, steps: list[Any], step: float | None = None,
          xs: list[float] | None = None) -> str:
    """Y ticks (``unit``) every ``step`` from 0 to ``top`` at the left, step numbers along the bottom at round
    values (``xs``: each point's x), grid lines between."""
    out = []
    step = step or top / 4
    for index in range(round(top / step) + 1):
        value = index * step
        y = _y(value, top, height)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_width}" y1="{y}" y2="{y}" stroke="#e5e5e5"/>'
                   f'<text x="{LEFT - 6}" y="{float(y) + 4:.1f}" text-anchor="end" font-size="11" fill="#555">'
                   f"{_e(_tick_label(value, unit))}</text>")
    for x, label in _x_ticks(steps, xs or _x_positions(steps, plot_width)):
        anchor = "end" if x > LEFT + plot_width - 20 else "middle"  # the last label stays inside the chart
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{height}" y2="{height + 4}" stroke="#888"/>'
                   f'<text x="{x:.1f}" y="{height + 16}" text-anchor="{anchor}" font-size="11" fill="#555">'
                   f"{_e(label)}</text>")
    out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_width}" y1="{height}" y2="{height}" stroke="#888"/>'
               f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP_PAD}" y2="{height}" stroke="#888"/>')
    return "".join(out)


def _numeric(steps: list[Any]) -> bool:
    """Steps that are numbers, none below the one before and the last above the first (a framework's step;
    several memory readings may share one): drawn at their value."""
    return (len(steps) >= 2 and all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in steps)
            and all(b >= a for a, b in itertools.pairwise(steps)) and steps[-1] > steps[0])


def _x_positions(steps: list[Any], plot_width: float) -> list[float]:
    """Each point's x: at its step's value when the steps are increasing numbers (readings taken at uneven steps
    keep their spacing), else evenly."""
    count = len(steps)
    if count < 2:
        return [LEFT + plot_width / 2] * count
    if _numeric(steps):
        first, span = steps[0], steps[-1] - steps[0]
        return [LEFT + plot_width * (s - first) / span for s in steps]
    return [LEFT + plot_width * i / (count - 1) for i in range(count)]


def _x_ticks(steps: list[Any], xs: list[float]) -> list[tuple[float, str]]:
    """Tick positions and labels along the x axis: round step numbers (1-2-5 apart, at most 8) when the steps
    are numbers, else every point's label thinned to 8."""
    if len(steps) < 2:
        return [(x, str(s)) for x, s in zip(xs, steps, strict=False)]
    if _numeric(steps):
        first, last = steps[0], steps[-1]
        every = max(1.0, nice_step(last - first, 8))
        value = math.ceil(first / every) * every
        out = []
        while value <= last + 1e-9:
            out.append((xs[0] + (xs[-1] - xs[0]) * (value - first) / (last - first), f"{value:g}"))
            value += every
        return out
    every = max(1, math.ceil(len(steps) / 8))
    return [(xs[i], str(steps[i])) for i in range(0, len(steps), every)]


def _tick_label(value: float, unit: str) -> str:
    if unit == "GiB":
        return f"{value:g} GiB"
    if unit == "ms":
        return duration_label(value)
    return f"{value:.3g} {unit}"


def duration_label(ms: float) -> str:
    """A duration for an axis, never in exponent notation: ``0.25 ms``, ``15.5 ms``, ``640 ms``, ``1.6 s``,
    ``12.4 s``, ``1234 s``."""
    if ms >= 1000:
        seconds = ms / 1000
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.1f} s" if seconds < 100 else f"{seconds:.0f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    return f"{ms:.3g} ms" if ms >= 0.01 or ms == 0 else f"{ms:.1e} ms"


def _svg(width: int, height: int, label: str, body: str) -> str:
    """An SVG drawn on a ``width`` × ``height`` grid that scales to its container's width (never wider than
    ``width``): no chart makes the page scroll sideways."""
    return (f'<svg viewBox="0 0 {width} {height}" width="100%" style="max-width:{width}px;height:auto;display:block" '
            f'role="img" aria-label="{_e(label)}">{body}</svg>')


def _chart(body: str, axes: str, width: int, height: int, label: str) -> str:
    return _svg(width, height + BOTTOM, label, axes + body)


def _hover_columns(xs: list[float], texts: list[str], height: int) -> str:
    """One transparent column per point whose title gives that step's values (shown under the pointer)."""
    if len(xs) < 2:
        return ""
    out = []
    for i, text in enumerate(texts[:len(xs)]):
        left = (xs[i - 1] + xs[i]) / 2 if i > 0 else xs[i] - (xs[1] - xs[0]) / 2
        right = (xs[i] + xs[i + 1]) / 2 if i + 1 < len(xs) else xs[i] + (xs[i] - xs[i - 1]) / 2
        out.append(f'<rect x="{left:.1f}" y="{TOP_PAD}" width="{max(right - left, 0.5):.1f}" '
                   f'height="{height - TOP_PAD}" fill="transparent"><title>{_e(text)}</title></rect>')
    return "".join(out)


def _step_axis(series: dict[str, list[float]], count: int, steps: list[Any] | None) -> list[Any]:
    return list(steps[-count:]) if steps and len(steps) >= count else list(range(count))


#: Fewer steps than this are drawn as bars (a line or an area between 3 points reads as a trend that isn't there).
BARS_BELOW = 20
#: Points in a phase's rolling median (drawn over the raw points, which stay faint), from this many steps on.
ROLLING = 5


def _rolling_median(values: list[float], width: int = ROLLING) -> list[float]:
    half = width // 2
    return [statistics.median(values[max(0, i - half):i + half + 1]) for i in range(len(values))]


def _series(series: dict[str, list[float]], steps: list[Any] | None = None, width: int = 1000,
            height: int = 90) -> str:
    """One small chart per phase, each on its own round y axis (a phase of 1 ms is not flattened by one of
    100 ms): the raw step times faint, and their rolling median over :data:`ROLLING` steps drawn over them."""
    values = [v for points in series.values() for v in points]
    if not values or max(values) <= 0:
        return "<p>no per-step phase times</p>"
    out = []
    for name, points in series.items():
        if len(points) < 2 or max(points) <= 0:
            continue
        out.append(_phase_chart(name, points, _step_axis(series, len(points), steps), width, height))
    smoothed = f"; bold: the median of {ROLLING} steps around each" if max(map(len, series.values())) >= 2 * ROLLING \
        else ""
    return "".join(out) + (f'<div class="legend">Each phase on its own scale (ms; x: step). Faint: every step'
                           f'{smoothed}.</div>')


def _phase_chart(name: str, points: list[float], axis: list[Any], width: int, height: int) -> str:
    top, step = nice_top(_scale(points), most=3)
    plot = width - LEFT
    xs = _x_positions(axis, plot)
    color = COLORS.get(name, "#999")
    smooth = len(points) >= 2 * ROLLING
    raw = " ".join(f"{x:.1f},{_y(v, top, height)}" for x, v in zip(xs, points, strict=False))
    body = [f'<polyline fill="none" stroke="{color}" stroke-width="{1 if smooth else 1.5}" '
            f'stroke-opacity="{0.35 if smooth else 1}" points="{raw}"><title>{_e(name)}</title></polyline>']
    if smooth:
        median = " ".join(f"{x:.1f},{_y(v, top, height)}" for x, v in zip(xs, _rolling_median(points), strict=False))
        body.append(f'<polyline class="median" fill="none" stroke="{color}" stroke-width="2" points="{median}">'
                    f"<title>{_e(name)}, median of {ROLLING} steps</title></polyline>")
    marks = _clipped(points, top, xs, color, name, axis)
    texts = [f"step {axis[i]}: {name} {p:.3f} ms" for i, p in enumerate(points)]
    caption = (f'<div class="legend">{_legend({name: ""})} p50 {statistics.median(points):.2f} ms, '
               f"max {max(points):.2f} ms{_above(len(marks), top)}</div>")
    return caption + _chart("".join(body) + "".join(marks) + _hover_columns(xs, texts, height),
                            _axes(plot, height, top, "ms", axis, step, xs), width, height, f"{name} per step")


def _stacked_series(series: dict[str, list[float]], steps: list[Any] | None = None, width: int = 1000,
                    height: int = 180) -> str:
    """Phase times stacked per step (an area per phase; a bar per step below :data:`BARS_BELOW` steps): how the
    step's time splits, step by step."""
    names = [n for n, points in series.items() if points]
    if not names:
        return ""
    count = min(len(series[n]) for n in names)
    totals = [sum(series[n][i] for n in names) for i in range(count)]
    if not totals or max(totals) <= 0:
        return ""
    top, tick = nice_top(_scale(totals))
    plot = width - LEFT
    axis = _step_axis(series, count, steps)
    bars = count < BARS_BELOW
    if bars:  # evenly spaced, each bar a slot's 70% wide
        slot = plot / count
        xs = [LEFT + slot * (i + 0.5) for i in range(count)]
    else:
        xs = _x_positions(axis, plot)
    base = [0.0] * count
    shapes = []
    for name in names:
        upper = [base[i] + series[name][i] for i in range(count)]
        color = COLORS.get(name, "#999")
        if bars:
            for i in range(count):
                y_top, y_base = float(_y(upper[i], top, height)), float(_y(base[i], top, height))
                shapes.append(f'<rect x="{xs[i] - 0.35 * slot:.1f}" y="{y_top:.1f}" width="{0.7 * slot:.1f}" '
                              f'height="{max(0.0, y_base - y_top):.1f}" fill="{color}"><title>step {_e(axis[i])}: '
                              f"{_e(name)} {series[name][i]:.3f} ms</title></rect>")
        else:
            points = [f"{xs[i]:.1f},{_y(upper[i], top, height)}" for i in range(count)]
            points += [f"{xs[i]:.1f},{_y(base[i], top, height)}" for i in reversed(range(count))]
            shapes.append(f'<polygon fill="{color}" fill-opacity="0.85" points="{" ".join(points)}">'
                          f"<title>{_e(name)}</title></polygon>")
        base = upper
    texts = [f"step {axis[i]}: {totals[i]:.3f} ms = " + ", ".join(f"{n} {series[n][i]:.3f}" for n in names)
             for i in range(count)]
    legend = _legend(dict.fromkeys(names, ""))
    marks = _clipped(totals, top, xs, "#2c3e50", "step total", axis)
    x_axis = axis if not bars else [str(a) for a in axis]  # bars: a label under each (thinned), not a value scale
    return (_chart("".join(shapes) + "".join(marks) + _hover_columns(xs, texts, height),
                   _axes(plot, height, top, "ms", x_axis, tick, xs), width, height, "stacked phase breakdown")
            + f'<div class="legend">{legend} (max {max(totals):.2f} ms per step{_above(len(marks), top)}; '
            f'x: step)</div>')


def _memory_line(memory: dict[str, Any], width: int = 1000, height: int = 140) -> str:
    """The memory in use at each reading against the capacity (GiB), with the peak."""
    series = memory.get("series") or {}
    used = series.get("used_bytes") or []
    capacity = memory.get("capacity_bytes") or 0
    gib = 2**30
    if memory.get("peak_step") is None and not used:  # no sample was taken: a run that never stepped
        return "<p>No memory sample was taken (no training step completed).</p>"
    text = (f"<p>peak {memory.get('peak_used_bytes', 0) / gib:.2f} GiB at step {_e(memory.get('peak_step'))} "
            f"({_e(memory.get('peak_phase'))})" + (f" of {capacity / gib:.2f} GiB ({_e(memory.get('limit'))})"
                                                  if capacity else "") + f"; device {_e(memory.get('device'))}</p>")
    if len(used) < 2:
        return text
    # scaled to the data, so that use far below capacity is not a flat line at the bottom; the capacity is drawn
    # when it is near enough to show, and said in words either way
    top = max(used) * 1.15 or 1.0
    shown = bool(capacity) and capacity <= top * 1.5
    if shown:
        top = max(top, capacity * 1.05)
    top_gib, tick = nice_top(top / gib)
    used_gib = [u / gib for u in used]
    plot = width - LEFT
    steps = series.get("step") or list(range(len(used)))
    xs = _x_positions(list(steps), plot)
    coords = " ".join(f"{x:.1f},{_y(u, top_gib, height)}" for x, u in zip(xs, used_gib, strict=False))
    limit = ""
    if shown:
        y = _y(capacity / gib, top_gib, height)
        limit = f'<line x1="{LEFT}" x2="{width}" y1="{y}" y2="{y}" stroke="#c0392b" stroke-dasharray="6 4"/>'
    texts = [f"step {s}: {u / gib:.3f} GiB" for s, u in zip(steps, used, strict=False)]
    body = (f'{limit}<polyline fill="none" stroke="#2c3e50" stroke-width="1.5" points="{coords}"/>'
            + _hover_columns(xs, texts, height))
    note = ("dashed: capacity" if shown else
            f"capacity {capacity / gib:.2f} GiB is above the chart (peak {max(used) / capacity:.1%} of it)"
            if capacity else "capacity unknown")
    return (text + _chart(body, _axes(plot, height, top_gib, "GiB", list(steps), tick, xs), width, height,
                          "memory used")
            + f'<div class="legend">Memory in use at each reading (GiB; x: the step it was read '
              f'in); {note}</div>')


def _top_work(window: dict[str, Any]) -> str:
    """The latest analysed window's top operators (and kernels on a GPU) with their share of the step."""
    metrics = window.get("metrics") or {}
    out = []
    for key, title in (("top_operators", "Top operators"), ("top_kernels", "Top kernels")):
        rows = metrics.get(key) or []
        if not rows:
            continue
        out.append(f'<h2 id="{key}">{title} (window at steps {window["first_step"]}–{window["last_step"]})</h2>'
                   "<table><tr><th>share of step</th><th>ms per step</th><th>name</th></tr>")
        for row in rows:
            share = f"{row['share']:.1%}" if row.get("share") is not None else "n/a"
            shapes = f" <code>{_e(row['input_shapes'])[:80]}</code>" if row.get("input_shapes") else ""
            out.append(f"<tr><td>{share}</td><td>{row['ms_per_step']:.3f}</td><td>{_e(row['name'][:100])}{shapes}"
                       "</td></tr>")
        out.append("</table>")
    return "".join(out)


def _throughput_html(throughput: dict[str, Any] | None) -> list[str]:
    """Throughput, MFU and the waterfall (a stacked bar from the ideal step to the measured one)."""
    from perfhooks.sinks.console import WATERFALL_NAMES, throughput_lines

    if not throughput:
        return []
    out = ['<h2 id="throughput">Throughput and MFU</h2>',
           "<p>" + "<br>".join(_e(line.strip()) for line in throughput_lines(throughput)) + "</p>"]
    fall = throughput.get("waterfall")
    if fall:
        bars = {"ideal": fall["ideal_ms"]}
        bars.update({WATERFALL_NAMES[key]: fall[key] for key in WATERFALL_NAMES if fall.get(key) is not None})
        out += [f"<p>From the ideal step (FLOPs ÷ peak, {fall['ideal_ms']:.2f} ms) to the measured one "
                f"({fall['step_ms']:.2f} ms):</p>", _stacked_bar(bars)]
    return out


def trace_link(path: str, base: Path | None) -> str:
    """A window's trace as a link from the page in folder ``base``: a relative path written at run time is
    relative to the folder the run started in (this process's working directory); from a later
    ``perfhooks report`` it is found under ``base/traces`` by name."""
    if base is None:
        return quote(Path(path).as_posix())
    target = Path(path) if Path(path).is_absolute() else Path.cwd() / path
    if not target.exists() and (base / "traces" / target.name).exists():
        target = base / "traces" / target.name
    return quote(Path(os.path.relpath(target.absolute(), base.absolute())).as_posix())


def render_html(report: dict[str, Any], series: dict[str, list[float]] | None = None,
                base: Path | None = None) -> str:
    """The report as one HTML page: the run's status when it did not complete, the diagnoses, then the step
    breakdown (mean and stacked per step), per-phase series, the memory line, top kernels and links to the
    traces (relative to ``base``, the folder the page is written in)."""
    metrics = report.get("metrics") or {}
    breakdown = metrics.get("breakdown") or {name: p["mean_ms"] for name, p in report["phases"].items()}
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>perfhooks report</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>perfhooks: {_e(report['framework'])} on {_e(report['device'].get('name', ''))}</h1>",
             f"<p>{report['steps']} steps, step time mean {report['step_ms']['mean']:.2f} ms, "
             f"p95 {report['step_ms']['p95']:.2f} ms; rank {report['rank']} of {report['world_size']}</p>"]
    overhead = overhead_line(report)
    if overhead:
        parts.append(f'<p id="overhead">{_e(overhead.strip())}</p>')
    status = status_line(report)
    if status:
        parts.append(f'<div class="status" id="status"><b>{_e(status)}</b></div>')
    parts.append('<h2 id="diagnoses">Diagnoses</h2>')
    if not report["diagnoses"]:
        parts.append("<p>No diagnosis fired.</p>")
    for diagnosis in report["diagnoses"]:
        parts.append(
            f'<div class="diag {_e(diagnosis["severity"])}"><b>{_e(diagnosis["title"])}</b> '
            f'<code>{_e(diagnosis["id"])}</code> [{_e(diagnosis["severity"])}]'
            + (f", fixing it {_e(worth_phrase(diagnosis))}" if worth_phrase(diagnosis) else "")
            + f'<br>Evidence: {_e(diagnosis["evidence"])}<br>'
            f'Fix: {_e(diagnosis["recommendation"])}'
            + (f' (<a href="{_e(diagnosis["docs"])}">docs</a>)' if diagnosis.get("docs") else "") + "</div>")
    run = report.get("run")
    if run:
        compiled = (f", {run.get('compilations', 0)} torch.compile compilation(s) ({run.get('compiling_s', 0.0):.2f} s)"
                    if run.get("compilations") else "")
        parts += [f"<h2>Where the run's time went</h2><p>{run['wall_s']:.2f} s from the first step to the end: "
                  f"{run['evaluations']} evaluation(s), {run['checkpoints']} checkpoint write(s){compiled}</p>",
                  _stacked_bar({"training": run["training_s"], "evaluation": run["evaluation_s"],
                                "checkpointing": run["checkpointing_s"], "compiling": run.get("compiling_s", 0.0),
                                "other": run["other_s"]})]
    parts += _throughput_html(report.get("throughput"))
    parts += ["<h2>Step breakdown</h2>", _stacked_bar(breakdown)]
    if "cpu_exec" in breakdown or "dataloader" in breakdown:  # a trace's roles, not the run's phases
        parts.append(f"<p>{_e(TRACE_ROLES)}</p>")
    if series:
        phases = {name: series[name] for name in PHASE_SERIES if name in series}
        steps = [s for s in series.get("global_step") or [] if s is not None] or None
        parts += ["<h2>Phases per step, stacked (ms; the framework's step below)</h2>",
                  _stacked_series(phases, steps), "<h2>Phases per step (ms)</h2>", _series(phases, steps)]
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
    analysed = [w for w in windows if (w.get("metrics") or {}).get("top_operators")]
    if analysed:
        parts.append(_top_work(analysed[-1]))
    if windows:
        parts.append("<h2>Traces</h2><ul>")
        for window in windows:
            parts.append(f'<li><a href="{_e(trace_link(window["path"], base))}">{_e(window["path"])}</a> steps '
                         f'{window["first_step"]}–{window["last_step"]}</li>')
        parts.append("</ul><p>To open a trace: drop the <code>.json.gz</code> onto <a href=\"https://ui.perfetto.dev\">"
                     "ui.perfetto.dev</a> (it stays in the browser), or run <code>perfhooks analyze PATH</code> "
                     "for the figures and verdicts in the terminal.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
