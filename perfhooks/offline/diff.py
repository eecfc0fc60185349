"""``perfhooks diff BEFORE AFTER``: what changed between two runs, two traces or two output folders.

Each side is a ``report.json`` (a run's, or ``perfhooks analyze --format json`` output), a perfhooks output
folder (its ``report.json``, with its latest window's trace for operators and kernels), or a trace file or
folder of traces (analysed). The comparison (:func:`compare`) gives, with ratios after/before:

- ``step_ms``: the steady step time (steps that overlapped perfhooks' own work left out) where the report has
  it, else the mean;
- ``phases``: each phase's ms per step and share (perfhooks' phases where both sides have them, else the trace
  breakdown's roles: kernel, memcpy, ..., dataloader, cpu_exec, other);
- ``diagnoses``: ``resolved`` (before only), ``new`` (after only), ``changed`` (another severity, or a gain moved by
  2 points and by half or more: a 9% warning that became a 0% information), ``unchanged``;
- ``operators`` and ``kernels``: those whose time per step changed most (µs); ``slower_operators``: those that grew,
  named when the step did not speed up as a whole or one of them took :data:`GREW` times as long or more (CPU
  flash attention's backward in bf16: 31 -> 91 ms a step while the step got faster);
- ``run``: the run's wall time and its parts (training, evaluation, checkpointing, compiling; s), where both
  reports have a run account: a fix of the evaluation moves the run, not the step;
- ``memory``: the peak (bytes).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from perfhooks.analysis.trace import TraceError
from perfhooks.offline.analyze import analyze_paths

PHASE_NAMES = ("data_wait", "forward", "backward", "optimizer", "other")
TOP = 10


def load_side(path: str | Path) -> dict[str, Any]:
    """``{"label", "report", "metrics"}`` for one side; ``metrics`` is the trace analysis (or None)."""

    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file or folder")
    report: dict[str, Any] | None = None
    if path.is_dir() and (path / "report.json").is_file():
        report = _read_report(path / "report.json")
    elif path.is_file() and path.name.endswith(".json") and not path.name.endswith(".pt.trace.json"):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            document = None
        if isinstance(document, dict) and "schema_version" in document and "phases" in document:
            report = document
    if report is None:  # traces: analyse them
        report = analyze_paths([path])
        return {"label": str(path), "report": report, "metrics": report.get("metrics")}
    metrics = report.get("metrics")
    if metrics is None:  # a run's report: its latest window's trace, where it still exists
        windows = [w for w in report.get("windows") or [] if w.get("path") and Path(w["path"]).exists()]
        if windows:
            metrics = analyze_paths([windows[-1]["path"]]).get("metrics")
    return {"label": str(path), "report": report, "metrics": metrics}


def _read_report(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise TraceError(f"{path}: unreadable report ({error})") from None


def _ratio(after: float | None, before: float | None) -> float | None:
    return after / before if after is not None and before else None


#: The two bases a diff's step and phases can share (``basis`` in the result).
STEADY, ALL_STEPS = "steady steps", "all steps"


def _has_steady(report: dict[str, Any]) -> bool:
    steady = report.get("steady") or {}
    return bool((steady.get("step_ms") or {}).get("mean")) and bool(steady.get("shares"))


def _step_ms(side: dict[str, Any], basis: str) -> float | None:
    report, metrics = side["report"], side["metrics"]
    if basis == STEADY:
        return report["steady"]["step_ms"]["mean"]
    if (report.get("step_ms") or {}).get("mean"):
        return report["step_ms"]["mean"]
    return metrics["step_us"] / 1e3 if metrics and metrics.get("step_us") else None


def _has_phases(report: dict[str, Any]) -> bool:
    phases = report.get("phases") or {}
    return any((phases.get(name) or {}).get("mean_ms") for name in PHASE_NAMES if name != "other")


def _phase(report: dict[str, Any], name: str, basis: str) -> tuple[float | None, float | None]:
    """A phase's ms per step and share, on ``basis``: the steady steps' shares of their mean step, or every step's
    phase means (the two add up to the step of the same basis)."""
    if basis == STEADY:
        share = report["steady"]["shares"].get(name)
        return (None if share is None else share * report["steady"]["step_ms"]["mean"]), share
    phase = report["phases"].get(name) or {}
    return phase.get("mean_ms"), phase.get("share")


def _phase_rows(before: dict[str, Any], after: dict[str, Any], basis: str) -> tuple[str, list[dict[str, Any]]]:
    if _has_phases(before["report"]) and _has_phases(after["report"]):
        rows = []
        for name in PHASE_NAMES:
            (b_ms, b_share), (a_ms, a_share) = (_phase(before["report"], name, basis),
                                                _phase(after["report"], name, basis))
            rows.append({"name": name, "before_ms": b_ms, "after_ms": a_ms, "ratio": _ratio(a_ms, b_ms),
                         "before_share": b_share, "after_share": a_share})
        return "phases", rows
    b_metrics, a_metrics = before["metrics"] or {}, after["metrics"] or {}
    b_roles, a_roles = b_metrics.get("breakdown") or {}, a_metrics.get("breakdown") or {}
    b_step, a_step = b_metrics.get("step_us") or 0.0, a_metrics.get("step_us") or 0.0
    rows = []
    for name in dict.fromkeys([*b_roles, *a_roles]):
        b, a = b_roles.get(name), a_roles.get(name)
        rows.append({"name": name, "before_ms": None if b is None else b / 1e3, "after_ms": None if a is None
                     else a / 1e3, "ratio": _ratio(a, b), "before_share": b / b_step if b is not None and b_step
                     else None, "after_share": a / a_step if a is not None and a_step else None})
    return "breakdown", rows


def _per_step(metrics: dict[str, Any] | None, key: str, name_key: str, time_key: str) -> dict[str, float] | None:
    """Time per step (µs) of each item of a side's top list; ``None`` when the side has no such list."""
    if not metrics or not metrics.get(key):
        return None
    steps = max(metrics.get("steps") or 1, 1)
    items = metrics.get(key) or []
    if isinstance(items, dict):  # kernels: {"top": [...]}
        items = items.get("top") or []
    out: dict[str, float] = {}
    for item in items:
        out[item[name_key]] = out.get(item[name_key], 0.0) + (item.get(time_key) or 0.0) / steps
    return out


def _changes(before: dict[str, float] | None, after: dict[str, float] | None) -> list[dict[str, Any]]:
    """The items whose time per step changed most. A side holds only its top list: an item missing from one side's
    list is ``None`` there ("not in its top N"), never 0, and its change is unknown (``None``); such rows rank by the
    time the other side gives."""
    if before is None or after is None:
        return []
    rows = []
    for name in dict.fromkeys([*before, *after]):
        b, a = before.get(name), after.get(name)
        rows.append({"name": name, "before_us": b, "after_us": a,
                     "change_us": a - b if a is not None and b is not None else None})
    return sorted(rows, key=lambda row: -abs(row["change_us"] if row["change_us"] is not None
                                             else (row["after_us"] or row["before_us"] or 0.0)))[:TOP]


#: An operator that took this many times as long a step after as before is named, whatever the step did.
GREW = 2.0
#: A step that sped up by less than this ratio (after/before above it) did not speed up as a whole.
NOT_FASTER = 0.98
#: Operators under this much time a step (µs) after are not named as slower.
GREW_MIN_US = 100.0


def slower_operators(operators: list[dict[str, Any]], step_ratio: float | None) -> list[dict[str, Any]]:
    """The compared operators that grew (``{name, before_us, after_us, ratio}``, the most grown first): every one
    that grew by :data:`GREW` or more, and, when the step did not speed up as a whole, the three that grew most."""
    grown = [{"name": row["name"], "before_us": row["before_us"], "after_us": row["after_us"],
              "ratio": row["after_us"] / row["before_us"]} for row in operators
             if row["change_us"] is not None and row["change_us"] > 0 and row["before_us"]
             and row["after_us"] >= GREW_MIN_US]
    grown.sort(key=lambda row: -(row["after_us"] - row["before_us"]))
    doubled = [row for row in grown if row["ratio"] >= GREW]
    if step_ratio is not None and step_ratio >= NOT_FASTER:
        return doubled + [row for row in grown[:3] if row not in doubled]
    return doubled


#: The run account's parts a diff compares (s).
RUN_PARTS = ("wall_s", "training_s", "evaluation_s", "checkpointing_s", "compiling_s")


def _run_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The run's wall time and its parts, before and after (s), where both reports have a run account."""
    if not before or not after or not before.get("wall_s") or not after.get("wall_s"):
        return []
    rows = []
    for key in RUN_PARTS:
        b, a = before.get(key), after.get(key)
        if (b or a) and b is not None and a is not None:
            rows.append({"name": key[:-2], "before_s": b, "after_s": a, "ratio": _ratio(a, b),
                         "before_share": b / before["wall_s"], "after_share": a / after["wall_s"]})
    return rows


#: A verdict in both runs whose estimated gain moved by at least this much (0..1 of the step) and by half or more
#: of the larger one has changed (a share that grew because the step got shorter has not). A share of the run's
#: wall time (``gain_basis`` ``"run"``: evaluation, checkpoints) has changed when it moved by this much and by
#: :data:`RUN_GAIN_CHANGE` of the larger one: the fix of an evaluation moves its share, not the step's.
GAIN_CHANGE = 0.02
RUN_GAIN_CHANGE = 0.2


def _diagnosis_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """``resolved`` (before only), ``new`` (after only), ``changed`` (in both, with another severity, or a gain
    moved by :data:`GAIN_CHANGE` and by half of the larger or more: ``{id, before: {severity, gain}, after: ...}``)
    and ``unchanged``."""
    b_by_id = {d["id"]: d for d in before}
    a_by_id = {d["id"]: d for d in after}

    def said(diagnosis: dict[str, Any]) -> dict[str, Any]:
        return {"severity": diagnosis.get("severity"), "gain": round(float(diagnosis.get("estimated_gain") or 0.0), 4)}

    changed, unchanged = [], []
    for name, diagnosis in a_by_id.items():
        if name not in b_by_id:
            continue
        was, now = said(b_by_id[name]), said(diagnosis)
        moved = abs(was["gain"] - now["gain"])
        relative = RUN_GAIN_CHANGE if diagnosis.get("gain_basis") == "run" else 0.5
        if was["severity"] != now["severity"] or (moved >= GAIN_CHANGE
                                                  and moved >= relative * max(was["gain"], now["gain"])):
            changed.append({"id": name, "before": was, "after": now})
        else:
            unchanged.append(name)
    losses = sorted({d["id"] for d in (*before, *after) if (d.get("tune") or {}).get("loss")})
    return {"resolved": [i for i in b_by_id if i not in a_by_id], "new": [i for i in a_by_id if i not in b_by_id],
            "changed": changed, "unchanged": unchanged, "tune_losses": losses}


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The comparison of two sides from :func:`load_side` (see the module docstring)."""
    basis = STEADY if _has_steady(before["report"]) and _has_steady(after["report"]) else ALL_STEPS
    b_step, a_step = _step_ms(before, basis), _step_ms(after, basis)
    kind, phases = _phase_rows(before, after, basis)
    b_ops = _per_step(before["metrics"], "top_operators", "name", "time_us")
    a_ops = _per_step(after["metrics"], "top_operators", "name", "time_us")
    b_peak = (before["report"].get("memory") or {}).get("peak_used_bytes")
    a_peak = (after["report"].get("memory") or {}).get("peak_used_bytes")
    b_kernels = _per_step(before["metrics"], "kernels", "name", "total_us")
    a_kernels = _per_step(after["metrics"], "kernels", "name", "total_us")
    operators = _changes(b_ops, a_ops)
    return {
        "before": before["label"], "after": after["label"],
        "basis": basis if kind == "phases" else "the trace's steps",
        "step_ms": {"before": b_step, "after": a_step, "ratio": _ratio(a_step, b_step)},
        "phase_source": kind, "phases": phases,
        "diagnoses": _diagnosis_changes(before["report"].get("diagnoses") or [],
                                        after["report"].get("diagnoses") or []),
        "operators": operators,
        "slower_operators": slower_operators(operators, _ratio(a_step, b_step)),
        "run": _run_rows(before["report"].get("run"), after["report"].get("run")),
        "top_n": {"operators": [len(b_ops or {}), len(a_ops or {})],
                  "kernels": [len(b_kernels or {}), len(a_kernels or {})]},
        "kernels": _changes(b_kernels, a_kernels),
        "memory": {"before_peak_bytes": b_peak, "after_peak_bytes": a_peak, "ratio": _ratio(a_peak, b_peak)},
        "throughput": _throughput_rows(before["report"].get("throughput"), after["report"].get("throughput")),
        "waste": {"before": _waste(before["report"]), "after": _waste(after["report"])},
    }


def _waste_line(result: dict[str, Any], side: str) -> str:
    """``waste before: dataloader_bound about 0.2 of 1.5 GPU-hours (12.00); ...``, or empty."""
    waste = (result.get("waste") or {}).get(side) or []
    return (f"waste {side}: " + "; ".join(
        f"{w['id']} about {w['device_hours']:.3g} of {w['of_device_hours']:.3g} {w['unit']}"
        + (f" ({w['money']:,.2f})" if w.get("money") is not None else "") for w in waste)) if waste else ""


def _waste(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each priced diagnosis' waste (the ledger's ``cost``): ``{id, device_hours, of_device_hours, unit, money}``."""
    return [{"id": d["id"], **d["cost"]} for d in report.get("diagnoses") or [] if d.get("cost")]


#: The throughput figures a diff compares (a run's report has them; a trace's has none).
THROUGHPUT_FIGURES = (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"))


def _throughput_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for key, label in THROUGHPUT_FIGURES:
        b, a = (before or {}).get(key), (after or {}).get(key)
        if b is not None or a is not None:
            rows.append({"name": key, "label": label, "before": b, "after": a, "ratio": _ratio(a, b)})
    return rows


def _figure(row: dict[str, Any], value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1%}" if row["name"] == "mfu" else f"{value:,.1f}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def format_text(result: dict[str, Any]) -> str:
    step = result["step_ms"]
    lines = [f"before: {result['before']}", f"after:  {result['after']}",
             f"step time  {_ms(step['before'])} ms -> {_ms(step['after'])} ms  ({_x(step['ratio'])}; step and phases: "
             f"means over {result.get('basis', ALL_STEPS)})",
             *(f"{row['label']:<10} {_figure(row, row['before'])} -> {_figure(row, row['after'])}  ({_x(row['ratio'])})"
               for row in result.get("throughput") or []),
             *_run_lines(result), *_slower_lines(result), "",
             f"  {'phase' if result['phase_source'] == 'phases' else 'role':<14}{'before ms':>11}{'after ms':>11}"
             f"{'ratio':>9}{'before':>9}{'after':>9}"]
    for row in result["phases"]:
        lines.append(f"  {row['name']:<14}{_ms(row['before_ms']):>11}{_ms(row['after_ms']):>11}"
                     f"{_x(row['ratio']):>9}{_pct(row['before_share']):>9}{_pct(row['after_share']):>9}")
    d = result["diagnoses"]
    lines += [""] + [f"diagnoses {key}: {', '.join(d[key]) or '-'}" for key in ("resolved", "new")]
    lines.append("diagnoses changed: " + (", ".join(
        f"{c['id']} ({c['before']['severity']} {c['before']['gain']:.0%} -> {c['after']['severity']} "
        f"{c['after']['gain']:.0%})" for c in d.get("changed") or []) or "-"))
    lines.append(f"diagnoses unchanged: {', '.join(d['unchanged']) or '-'}")
    if d.get("tune_losses"):
        lines.append("measured as a loss by perfhooks tune (do not apply their fix here): " + ", ".join(
            d["tune_losses"]))
    for key, title in (("operators", "operators"), ("kernels", "kernels")):
        # one rule: a change is shown only where both sides list the item; the others are named apart
        compared = [row for row in result[key] if row["change_us"] is not None]
        if compared:
            lines += ["", f"{title} whose time per step changed most (us):"]
            lines += [f"  {row['change_us']:>+12.1f}  {row['before_us']:>10.1f} -> {row['after_us']:>10.1f}  "
                      f"{row['name'][:80]}" for row in compared]
        lines += _only_one_side(result, key)
    for side in ("before", "after"):
        line = _waste_line(result, side)
        if line:
            lines.append(line)
    memory = result["memory"]
    if memory["before_peak_bytes"] or memory["after_peak_bytes"]:
        lines += ["", f"memory peak {_bytes(memory['before_peak_bytes'])} -> {_bytes(memory['after_peak_bytes'])} "
                      f"({_x(memory['ratio'])})"]
    return "\n".join(lines)


def _run_lines(result: dict[str, Any]) -> list[str]:
    """``run wall time 18.0 s -> 10.6 s (0.59x): training 7.2 -> 7.0 s, evaluation 10.8 -> 3.6 s``."""
    rows = {row["name"]: row for row in result.get("run") or []}
    if "wall" not in rows:
        return []
    wall = rows.pop("wall")
    parts = ", ".join(f"{name} {row['before_s']:.1f} -> {row['after_s']:.1f} s" for name, row in rows.items())
    return [f"run wall time {wall['before_s']:.1f} s -> {wall['after_s']:.1f} s ({_x(wall['ratio'])})"
            + (f": {parts}" if parts else "")]


def _slower_lines(result: dict[str, Any]) -> list[str]:
    """The operators that grew, said under the step (where the step's change hides them)."""
    rows = result.get("slower_operators") or []
    if not rows:
        return []
    return ["slower: " + "; ".join(f"{row['name'][:70]} {row['before_us'] / 1e3:.1f} -> {row['after_us'] / 1e3:.1f} "
                                   f"ms a step ({row['ratio']:.1f}x)" for row in rows)]


def _only_one_side(result: dict[str, Any], key: str) -> list[str]:
    """The items only one side's top list holds: named, not compared (their change is unknown)."""
    top = (result.get("top_n") or {}).get(key, [0, 0])
    lines = []
    for side, index, other in (("after", 1, 0), ("before", 0, 1)):
        only = [row["name"][:60] for row in result[key] if row["change_us"] is None and row[f"{side}_us"] is not None]
        if only:
            lines.append(f"  only in {side}'s top {top[index] or '?'} {key} (not in the other's top "
                         f"{top[other] or '?'}, so not compared): {', '.join(only)}")
    return lines


def _bytes(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MiB"


def format_html(result: dict[str, Any]) -> str:
    """One self-contained page (no network): the same tables as the text."""
    e = html.escape
    step = result["step_ms"]

    def table(headers: list[str], rows: list[list[str]]) -> str:
        head = "".join(f"<th>{e(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    parts = [f"<h1>perfhooks diff</h1><p>before: <code>{e(result['before'])}</code><br>after: "
             f"<code>{e(result['after'])}</code></p>",
             f"<p id='step'>step time {_ms(step['before'])} ms → {_ms(step['after'])} ms ({_x(step['ratio'])}; "
             f"step and phases: means over {e(result.get('basis', ALL_STEPS))})"
             + "".join(f"<br>{e(row['label'])} {_figure(row, row['before'])} → {_figure(row, row['after'])} "
                       f"({_x(row['ratio'])})" for row in result.get("throughput") or [])
             + "".join(f"<br>{e(line)}" for line in (*_run_lines(result), *_slower_lines(result))) + "</p>",
             table([result["phase_source"], "before ms", "after ms", "ratio", "before share", "after share"],
                   [[r["name"], _ms(r["before_ms"]), _ms(r["after_ms"]), _x(r["ratio"]), _pct(r["before_share"]),
                     _pct(r["after_share"])] for r in result["phases"]]),
             table(["diagnoses", "ids"], [[k, ", ".join(v) or "-"] for k, v in result["diagnoses"].items()])]
    for key in ("operators", "kernels"):
        compared = [r for r in result[key] if r["change_us"] is not None]
        if compared:
            parts.append(f"<h2>{e(key)} whose time per step changed most</h2>" + table(
                [key, "before µs/step", "after µs/step", "change"],
                [[r["name"], f"{r['before_us']:.1f}", f"{r['after_us']:.1f}", f"{r['change_us']:+.1f}"]
                 for r in compared]))
        parts += [f"<p>{e(line.strip())}</p>" for line in _only_one_side(result, key)]
    for side in ("before", "after"):
        line = _waste_line(result, side)
        if line:
            parts.append(f"<p class='waste'>{e(line)}</p>")
    memory = result["memory"]
    if memory["before_peak_bytes"] or memory["after_peak_bytes"]:
        parts.append(f"<p id='memory'>memory peak {_bytes(memory['before_peak_bytes'])} → "
                     f"{_bytes(memory['after_peak_bytes'])} ({_x(memory['ratio'])})</p>")
    style = ("body{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse;"
             "margin:12px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>perfhooks diff</title><style>{style}</style>" \
           f"</head><body>{''.join(parts)}</body></html>"
