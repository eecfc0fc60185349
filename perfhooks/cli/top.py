"""``perfhooks top [DIR ...]``: a live view of a running job, from the live files its ranks write.

Each rank writes ``live.rank<R>.json`` beside its report every few seconds (:mod:`perfhooks.runtime.state.live_watch`),
so the view works on node-local folders (one DIR per node, gathered however the cluster allows) and on a shared
folder. Stalled ranks come first, then the slowest; a rank whose file has not changed for :data:`STALE_S` seconds
while it was running is marked stale (its process may have died). The time in phase is as of the file's write; the
file's age is its own column. Under a folder holding several runs, the newest is shown and the title says so. The
table fits the terminal: at 80 columns (a pipe, a CI log, ``watch``) it keeps short headers and the top two phases.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from perfhooks.cli.machine import out
from perfhooks.rules.stalls import OWN_WAITS

#: Seconds after which a running rank's live file is stale.
STALE_S = 15.0


def live_files(folders: list[str]) -> list[Path]:
    """Every ``live.rank<R>.json`` under the folders (recursively)."""
    found: list[Path] = []
    for folder in map(Path, folders):
        if folder.is_file():
            found.append(folder)
        elif folder.is_dir():
            found.extend(sorted(folder.rglob("live.rank*.json")))
    return found


def read_frame(folders: list[str], now: float | None = None) -> dict[str, Any]:
    """One frame: ``{"ranks": [...], "stalls": [...], "summary": str}``, stalled ranks first, then the slowest."""
    now = time.time() if now is None else now
    runs: dict[str, dict[int, dict[str, Any]]] = {}  # by folder (one run's ranks write beside each other)
    for path in live_files(folders):
        try:
            live = json.loads(path.read_text())
        except (OSError, ValueError):  # written atomically: a file being replaced is read next time
            continue
        if not isinstance(live, dict) or "rank" not in live:
            continue
        age = max(0.0, now - float(live.get("updated_at") or now))
        live["age_s"] = round(age, 1)
        live["stale"] = live.get("status") == "running" and age > STALE_S
        live["path"] = str(path)
        ranks = runs.setdefault(str(path.parent), {})
        if live["rank"] not in ranks or ranks[live["rank"]]["updated_at"] < live["updated_at"]:
            ranks[live["rank"]] = live
    chosen, others = _newest_run(runs, len(folders))
    ranks = runs.get(chosen, {}) if chosen is not None else {}
    # stalled ranks first, a rank stuck on its own loader before those that wait for it in a collective
    ordered = sorted(ranks.values(), key=lambda r: (not r.get("stalled"), r.get("phase") not in OWN_WAITS,
                                                    -(r.get("step_p50_ms") or 0.0), r["rank"]))
    stalls = [dict(stall, rank=r["rank"]) for r in ordered for stall in r.get("stalls") or []]
    stalls.sort(key=lambda s: (s.get("ended", False), -(s.get("seconds") or 0.0)))
    said = summary(ordered)
    if others:
        said = (f"{said} (run {chosen}, the newest of {len(others) + 1} runs found; the others: "
                f"{', '.join(others)}: pass one folder to see it)")
    return {"ranks": ordered, "stalls": stalls, "summary": said, "run": chosen, "other_runs": others}


def _newest_run(runs: dict[str, dict[int, dict[str, Any]]], given: int) -> tuple[str | None, list[str]]:
    """The run to show: with one folder given per node (several folders), all of them are one job and are shown
    together; under one folder holding several runs' folders, the most recently updated one."""
    if not runs:
        return None, []
    if given > 1:  # node-local folders of one job: merge them under the first
        merged: dict[int, dict[str, Any]] = {}
        for ranks in runs.values():
            for rank, live in ranks.items():
                if rank not in merged or merged[rank]["updated_at"] < live["updated_at"]:
                    merged[rank] = live
        first = next(iter(runs))
        runs.clear()
        runs[first] = merged
        return first, []
    newest = max(runs, key=lambda folder: max(float(r.get("updated_at") or 0.0) for r in runs[folder].values()))
    return newest, sorted(folder for folder in runs if folder != newest)


def summary(ranks: list[dict[str, Any]]) -> str:
    """Who is stuck and what the others wait in: ``rank 1 stalled in data_wait (dataset.py:42 in __getitem__);
    ranks 0, 2-7 in backward``."""
    if ranks and all(live.get("status") not in (None, "running") for live in ranks):  # the run is over
        status = ranks[0]["status"]
        return f"run {status} at step {max(int(live.get('step') or 0) for live in ranks)}"
    parts = []
    for live in ranks:
        if live.get("stalled"):
            where = live["stack"][-1].rsplit("/", 1)[-1] if live.get("stack") else ""
            parts.append(f"rank {live['rank']} stalled in {live['phase']}" + (f" ({where})" if where else ""))
    by_phase: dict[str, list[int]] = {}
    for live in ranks:
        if not live.get("stalled"):
            by_phase.setdefault(live.get("phase") or "other", []).append(live["rank"])
    for phase, members in by_phase.items():
        word = "rank" if len(members) == 1 else "ranks"
        parts.append(f"{word} {_spans(sorted(members))} in {phase}")
    return "; ".join(parts)


def _spans(numbers: list[int]) -> str:
    """``0, 2-7``: runs of consecutive numbers."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


#: Rows a frame shows (stalled ranks first, then the slowest); the rest are summed up in one row.
MAX_ROWS = 40


#: Terminal width from which every column is shown; narrower, the compact set.
WIDE_COLUMNS = 160


def render(frame: dict[str, Any], max_rows: int = MAX_ROWS, width: int = 80) -> Any:
    """The frame as a ``rich`` table of at most ``width`` columns: the first ``max_rows`` ranks (the stuck and the
    slowest), then one row that says what the others do. Below :data:`WIDE_COLUMNS` the columns are the compact
    set (short headers, the top two phases)."""
    from rich.table import Table

    wide = width >= WIDE_COLUMNS
    ages = [live.get("age_s", 0.0) for live in frame["ranks"]]
    title = frame["summary"] or "no rank has written a live file yet"
    if ages and not wide:  # the files' age, once (in the wide view, a column)
        title += f" (files {min(ages):.0f}-{max(ages):.0f} s old)" if max(ages) - min(ages) >= 1 else \
            f" (files {max(ages):.0f} s old)"
    table = Table(title=title, title_justify="left", width=None if wide else width, box=_box() if wide else None,
                  pad_edge=False, padding=(0, 1) if wide else (0, 0, 0, 1))
    columns = (("rank", "step", "steps/s", "p50 ms", "p95 ms", "phase", "in phase", "age", "shares", "memory",
                "samples/s", "perfhooks", "verdicts") if wide else
               ("rank", "step", "p50 ms", "phase", "in", "top phases", "verdicts"))
    for column in columns:
        left = column in ("phase", "shares", "top phases", "verdicts")
        table.add_column(column, justify="left" if left else "right", no_wrap=not (wide and left),
                         overflow="fold" if wide and left else "ellipsis",
                         min_width=len(column) if wide else {"phase": 17, "top phases": 16}.get(column, len(column)))
    shown, rest = frame["ranks"][:max_rows], frame["ranks"][max_rows:]
    for live in shown:
        shares = live.get("shares") or {}
        state = "STALLED " if live.get("stalled") else ("stale " if live.get("stale") else "")
        verdicts = list(live.get("verdicts") or []) + (["stalled"] if live.get("stalled") else [])
        phase = f"{state}{live.get('phase') or live.get('status')}"  # STALLED data_wait: 17 characters
        in_phase = f"{live.get('in_phase_s', 0.0):.0f} s" if live.get("status") == "running" else ""
        age = f"{live.get('age_s', 0.0):.0f} s"
        if wide:
            table.add_row(
                str(live["rank"]), str(live.get("step")), _number(live.get("steps_per_s"), 2),
                _number(live.get("step_p50_ms"), 1), _number(live.get("step_p95_ms"), 1), phase, in_phase, age,
                " ".join(f"{name[:4]} {share:.0%}" for name, share in shares.items() if share >= 0.005),
                _number((live.get("memory_bytes") or 0) / 2**30, 2, " GiB") if live.get("memory_bytes") else "",
                _number(live.get("samples_per_s"), 1),
                f"{live['overhead']:.1%}" if live.get("overhead") is not None else "", ", ".join(verdicts))
        else:
            top = sorted(shares.items(), key=lambda item: -item[1])[:2]
            table.add_row(str(live["rank"]), str(live.get("step")), _number(live.get("step_p50_ms"), 1), phase,
                          in_phase, " ".join(f"{SHORT.get(name, name[:4])} {share:.0%}" for name, share in top
                                             if share >= 0.005),
                          verdicts[0] + (f" +{len(verdicts) - 1}" if len(verdicts) > 1 else "") if verdicts else "")
    if rest:
        table.add_row(f"+{len(rest)}", "", "", summary(rest), *([""] * (len(columns) - 4)))
    return table


#: Short names of the phases for the compact view.
SHORT = {"data_wait": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "other": "other"}


def _box() -> Any:
    from rich import box

    return box.HEAVY_HEAD


def _number(value: Any, digits: int, unit: str = "") -> str:
    return f"{value:.{digits}f}{unit}" if isinstance(value, (int, float)) else ""


def run(folders: list[str], once: bool, as_json: bool, every_s: float = 2.0) -> int:
    """Print one frame (``once``, or ``as_json``) or refresh one until Ctrl-C; exit 2 when no live file is found."""
    if not live_files(folders):
        print(f"perfhooks: {', '.join(folders)}: no live.rank*.json found (is a perfhooks run writing there?)",
              file=sys.stderr)
        return 2
    if as_json:
        frame = read_frame(folders)
        print(json.dumps({"ranks": frame["ranks"], "stalls": frame["stalls"], "summary": frame["summary"]},
                         indent=2), file=out())
        return 0
    from rich.console import Console
    from rich.live import Live

    console = Console()
    rows = max(5, console.height - 8) if console.is_terminal else MAX_ROWS
    width = console.width
    if once:
        console.print(render(read_frame(folders), rows, width))
        return 0
    try:
        with Live(render(read_frame(folders), rows, width), console=console, refresh_per_second=1) as view:
            while True:
                time.sleep(every_s)
                view.update(render(read_frame(folders), rows, console.width))
    except KeyboardInterrupt:
        return 0
