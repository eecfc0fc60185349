"""``perfhooks top [DIR ...]``: a live view of a running job, from the live files its ranks write.

Each rank writes ``live.rank<R>.json`` beside its report every few seconds (:mod:`perfhooks.runtime.live_watch`),
so the view works on node-local folders (one DIR per node, gathered however the cluster allows) and on a shared
folder. Stalled ranks come first, then the slowest; a rank whose file has not changed for :data:`STALE_S` seconds
while it was running is marked stale (its process may have died).
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
    ranks: dict[int, dict[str, Any]] = {}
    for path in live_files(folders):
        try:
            live = json.loads(path.read_text())
        except (OSError, ValueError):  # written atomically: a file being replaced is read next time
            continue
        if not isinstance(live, dict) or "rank" not in live:
            continue
        age = max(0.0, now - float(live.get("updated_at") or now))
        running = live.get("status") == "running"
        live["age_s"] = round(age, 1)
        live["stale"] = running and age > STALE_S
        if running:
            live["in_phase_s"] = round(float(live.get("in_phase_s") or 0.0) + age, 1)
        live["path"] = str(path)
        if live["rank"] not in ranks or ranks[live["rank"]]["updated_at"] < live["updated_at"]:
            ranks[live["rank"]] = live
    # stalled ranks first, a rank stuck on its own loader before those that wait for it in a collective
    ordered = sorted(ranks.values(), key=lambda r: (not r.get("stalled"), r.get("phase") not in OWN_WAITS,
                                                    -(r.get("step_p50_ms") or 0.0), r["rank"]))
    stalls = [dict(stall, rank=r["rank"]) for r in ordered for stall in r.get("stalls") or []]
    stalls.sort(key=lambda s: (s.get("ended", False), -(s.get("seconds") or 0.0)))
    return {"ranks": ordered, "stalls": stalls, "summary": summary(ordered)}


def summary(ranks: list[dict[str, Any]]) -> str:
    """Who is stuck and what the others wait in: ``rank 1 stalled in data_wait (dataset.py:42 in __getitem__);
    ranks 0, 2-7 in backward``."""
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


def render(frame: dict[str, Any], max_rows: int = MAX_ROWS) -> Any:
    """The frame as a ``rich`` table: the first ``max_rows`` ranks (the stuck and the slowest), then one row that
    says what the others do."""
    from rich.table import Table

    table = Table(title=frame["summary"] or "no rank has written a live file yet", title_justify="left")
    for column in ("rank", "step", "steps/s", "p50 ms", "p95 ms", "phase", "in phase", "shares", "memory",
                   "samples/s", "verdicts"):
        table.add_column(column, justify="left" if column in ("phase", "shares", "verdicts") else "right")
    shown, rest = frame["ranks"][:max_rows], frame["ranks"][max_rows:]
    for live in shown:
        shares = live.get("shares") or {}
        state = "STALLED " if live.get("stalled") else ("stale " if live.get("stale") else "")
        verdicts = list(live.get("verdicts") or []) + (["stalled"] if live.get("stalled") else [])
        table.add_row(
            str(live["rank"]), str(live.get("step")), _number(live.get("steps_per_s"), 2),
            _number(live.get("step_p50_ms"), 1), _number(live.get("step_p95_ms"), 1),
            f"{state}{live.get('phase')}", f"{live.get('in_phase_s', 0.0):.0f} s",
            " ".join(f"{name[:4]} {share:.0%}" for name, share in shares.items() if share >= 0.005),
            _number((live.get("memory_bytes") or 0) / 2**30, 2, " GiB") if live.get("memory_bytes") else "",
            _number(live.get("samples_per_s"), 1), ", ".join(verdicts))
    if rest:
        table.add_row(f"+{len(rest)}", "", "", "", "", summary(rest), "", "", "", "", "")
    return table


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
    if once:
        console.print(render(read_frame(folders), rows))
        return 0
    try:
        with Live(render(read_frame(folders), rows), console=console, refresh_per_second=1) as view:
            while True:
                time.sleep(every_s)
                view.update(render(read_frame(folders), rows))
    except KeyboardInterrupt:
        return 0
