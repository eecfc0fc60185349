"""Writing reports, in one place: ``report.json`` and ``report.html`` atomically, a newer report never
overwritten by an older one, and the merged report of several ranks from the output folder.

The page is rendered by the function the caller passes (``render``: the HTML sink's ``render_html``), so this
layer imports no sink.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.files.atomic import atomic_write_bytes, atomic_write_json, read_json_object
from perfhooks.report.merge import merge_rank_reports
from perfhooks.report.schema import REPORT_FILE, report_path
from perfhooks.timebase import monotonic

#: ``render(report, series=..., base=folder) -> str``: a report as a self-contained HTML page.
Render = Callable[..., str]


def write_report(output_dir: Path, report: dict[str, Any], render: Render | None = None) -> Path | None:
    """``report.json`` and, beside it (with ``render``), the same content as a self-contained ``report.html``.

    A write loses (nothing is written, ``None``) when the file on disk is newer: a later run's
    report (a retry, the next run of a sweep), or this run's final report when ``report`` was
    taken at a window's end.
    """
    path = report_path(output_dir, report["rank"], report["world_size"])
    if not supersedes(report, read_json_object(path)):
        return None
    _write_json_and_html(path, report, render)
    return path


def supersedes(report: dict[str, Any], on_disk: dict[str, Any] | None) -> bool:
    """Whether ``report`` may replace ``on_disk``: same run and not a window-end write over a final one,
    or a run that started no earlier."""
    if not on_disk or report.get("run_id") is None:
        return True
    if on_disk.get("run_id") == report["run_id"]:
        return not (report.get("status") == "running" and on_disk.get("status") != "running")
    return float(report.get("started_at") or 0.0) >= float(on_disk.get("started_at") or 0.0)


def _write_json_and_html(path: Path, report: dict[str, Any], render: Render | None) -> None:
    # a run's last word (not a report written while it runs) is on disk before the close goes on: a host
    # OOM-kill or a node's power loss right after keeps it
    atomic_write_json(path, report, durable=report.get("status") != "running")
    if render is not None:
        atomic_write_bytes(path.with_suffix(".html"), render(report, series=report.get("series"),
                                                             base=path.parent).encode())


def write_merged_report(output_dir: Path, world_size: int, thresholds: Any = None,
                        render: Render | None = None) -> Path | None:
    """Once every rank's final ``report.rank{R}.json`` is there, ``report.json`` (and ``.html``) for the whole run.

    Each rank calls this after writing its own report; the last to finish sees them all. No
    collective is involved, so a rank that died or is slow delays nothing.
    """
    reports = rank_reports(output_dir, range(world_size), final=True)
    if reports is None:
        return None
    target = output_dir / REPORT_FILE
    merged = merge_rank_reports(reports, thresholds)
    if not supersedes(merged, read_json_object(target)):
        return None
    _write_json_and_html(target, merged, render)
    return target


def write_run_report(output_dir: Path, merged: dict[str, Any], render: Render | None = None) -> Path | None:
    """Rank 0's merged report (from the store) as ``report.json`` (and ``.html``), unless a newer one is there."""
    target = output_dir / REPORT_FILE
    if not supersedes(merged, read_json_object(target)):
        return None
    _write_json_and_html(target, merged, render)
    return target


def rank_reports(output_dir: Path, ranks: Any, wait_s: float = 0.0, final: bool = False
                 ) -> list[dict[str, Any]] | None:
    """The ``report.rank{R}.json`` of ``ranks``, polling up to ``wait_s`` seconds (no collective);
    with ``final``, only end-of-training ones count (not those a window's end wrote). ``None`` if one
    is still missing then."""
    import json
    import time

    deadline = monotonic() + wait_s
    paths = [output_dir / f"report.rank{r}.json" for r in ranks]
    while True:
        try:
            reports = [json.loads(p.read_text()) for p in paths]
            if not final or all(r.get("status") not in ("running", None) for r in reports):
                return reports
        except (OSError, ValueError):  # not written yet (written atomically: never half a file)
            pass
        if monotonic() >= deadline:
            return None
        time.sleep(0.1)
