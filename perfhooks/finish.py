"""The end of a run, in one place: what :meth:`perfhooks.engine.Engine.close` does, in order.

1. The open step: an aside cut short ends; a step whose optimizer stepped is counted; a step cut
   short is not. The run account stops.
2. The profiler window stops (its partial trace is saved) and pending CUDA timings are read: the
   run's only host sync. Neither happens after a CUDA error (the context may be broken).
3. Hooks, the on-demand trigger and the writer thread end (the writer within the deadline).
4. The report is built; memory history stops; W&B gets its last row, table and summary (rank 0 may
   wait for the other ranks' final reports); ``report.json`` and the merged report are written;
   the table is printed.

Every part is guarded: a fault is reported once and the rest goes on. ``deadline`` bounds the
waits (5 s in total at interpreter exit or after an uncaught error).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from perfhooks import rank_store
from perfhooks.ranks import rank_summary
from perfhooks.report import (
    merge_rank_reports,
    merge_summaries,
    rank_reports,
    write_merged_report,
    write_report,
    write_run_report,
)
from perfhooks.sinks.console import format_table
from perfhooks.sinks.html import render_html

#: Seconds the logging rank waits, at the end, for the other ranks' reports to attach to W&B.
RANK_WAIT_S = 10.0
#: Seconds the writer thread gets to finish its queue (trace exports, reports) at a normal end.
WRITER_WAIT_S = 60.0
#: Seconds W&B gets to take its last rows and files at a normal end.
WANDB_WAIT_S = 30.0


class Deadline:
    """Seconds left of an optional total budget."""

    def __init__(self, seconds: float | None) -> None:
        self._end = None if seconds is None else time.monotonic() + seconds

    def left(self, cap: float) -> float:
        """At most ``cap`` seconds, and no more than what is left (never negative)."""
        if self._end is None:
            return cap
        return max(0.0, min(cap, self._end - time.monotonic()))


def finish_run(engine: Any, deadline: Deadline) -> dict[str, Any] | None:
    """Close ``engine``'s run (called once, by ``Engine.close``); the final report."""
    guarded = engine.guarded_call
    guarded("close_step", engine.end_open_step)
    engine.account.close()
    if not engine.cuda_broken:
        guarded("window_close", engine.windows.close)
        guarded("flush_timings", lambda: engine.pending.drain(engine.stats, block=True))
    engine.hooks.remove()
    if engine.trigger is not None:
        guarded("trigger_close", engine.trigger.close)
    engine.writer.close(deadline.left(WRITER_WAIT_S))
    report = engine.report()
    if engine.memory is not None and not engine.cuda_broken:
        guarded("memory_stop", engine.memory.stop)
    run_report: dict[str, Any] | None = None
    store = guarded("rank_store", rank_store.default_store) if engine.world_size > 1 else None
    if engine.world_size > 1:
        run_report = guarded("rank_merge", lambda: gather_ranks(engine, report, deadline, store))
    if engine.wandb is not None:
        guarded("wandb_close", lambda: close_wandb(engine, report, deadline, run_report))
    guarded("report_write", lambda: write_report(engine.output_dir, report))
    if store is not None:  # rank 0 merged the store's summaries
        if run_report is not None:
            guarded("report_merge", lambda: write_run_report(engine.output_dir, run_report))
    elif engine.world_size > 1:  # no process group: the last rank to finish merges the folder's reports
        guarded("report_merge", lambda: write_merged_report(engine.output_dir, engine.world_size,
                                                              engine.config.thresholds))
    if engine.console and engine.rank == 0:
        print(format_table(report), file=sys.stderr)
    return report


def gather_ranks(engine: Any, report: dict[str, Any], deadline: Deadline, store: Any
                 ) -> dict[str, Any] | None:
    """The run's merged report on rank 0 (None elsewhere, or when it cannot be had).

    With a process group (``store`` is its key-value store): every rank publishes its summary there; rank 0
    collects the others' within ``RANK_WAIT_S`` and merges what came, listing the rest as missing. Without
    one: the rank that logs to W&B reads the others' ``report.rank{R}.json`` from the (shared) output folder
    within the wait.
    """
    others = [r for r in range(engine.world_size) if r != engine.rank]
    if store is not None:
        index = rank_store.next_index()
        summary = rank_summary(report)
        rank_store.publish(store, index, engine.rank, summary)
        if engine.rank != 0:
            return None
        wait_s = deadline.left(RANK_WAIT_S)
        summaries, missing = rank_store.collect(store, index, others, wait_s)
        if missing:
            engine.once.warn("ranks_late", f"rank(s) {', '.join(map(str, missing))} sent no summary within "
                                           f"{wait_s:.0f} s; the merged report lists them as missing")
        return merge_summaries(report, [summary, *summaries], engine.config.thresholds, "store", engine.world_size)
    if engine.wandb is None or not engine.wandb.resolve():
        return None
    wait_s = deadline.left(RANK_WAIT_S)
    reports = rank_reports(engine.output_dir, others, wait_s=wait_s, final=True)
    if reports is None:
        engine.once.warn("ranks_late", f"not every rank's final report was there within {wait_s:.0f} s; "
                                       "W&B gets this rank's figures only")
        return None
    return merge_rank_reports([report, *reports], engine.config.thresholds)


def close_wandb(engine: Any, report: dict[str, Any], deadline: Deadline,
                run_report: dict[str, Any] | None = None) -> None:
    """The last W&B row, table, summary and files (with the run's merged report on a multi-rank run); the
    ``wandb`` section of the report."""
    sink = engine.wandb
    recent = list(engine.stats.recent)[-engine.config.wandb_log_every:]
    latest = engine.memory.latest if engine.memory is not None else None
    run_report = run_report or report
    sink.close(engine.global_step, run_report, recent, latest, render_html(run_report, series=report.get("series")),
               timeout_s=deadline.left(WANDB_WAIT_S))
    if sink.run is not None or sink.failed:
        report["wandb"] = sink.section()
