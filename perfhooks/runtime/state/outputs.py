"""Where a run's figures go besides its files: W&B rows, window rows and the last summary, and the printed table.

Only the rank that logs to trackers has a W&B sink (:func:`perfhooks.distributed.ranks.logs_to_trackers`).
Rows are handed over at step ends (every ``wandb_log_every`` steps) and window ends; the sink's own queue sends
them off the training thread.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from perfhooks.config import PerfConfig
from perfhooks.distributed import ranks
from perfhooks.faults import FaultLog, Once
from perfhooks.report.statistics import StepTiming
from perfhooks.rules.pipeline import with_cross_rank
from perfhooks.rules.ranks import CROSS_RANK
from perfhooks.sinks.console import early_lines, format_table, fresh_line
from perfhooks.sinks.html import render_html
from perfhooks.sinks.wandb import RunSource, WandbSink

#: Steps between W&B rows when neither the setting nor the framework says.
DEFAULT_ROWS_EVERY = 50


class RunOutputs:
    """The W&B sink (on the logging rank) and the end-of-run table."""

    def __init__(self, config: PerfConfig, rank: int, output_dir: Path, wandb_source: RunSource | None,
                 faults: FaultLog, once: Once, start_step: int) -> None:
        self.config = config
        self.rank = rank
        self.output_dir = output_dir
        self.wandb: WandbSink | None = None
        if config.wandb is not False and ranks.logs_to_trackers(rank):
            self.wandb = WandbSink(source=wandb_source or RunSource(), explicit_run=config.wandb_run,
                                   open_if_missing=config.wandb is True, queue=config.wandb_queue,
                                   output_dir=output_dir, faults=faults, once=once)
        #: Steps between W&B rows: the setting, else the framework's own logging cadence, else 50.
        self.every: int = config.wandb_log_every or (wandb_source.log_every if wandb_source else None) \
            or DEFAULT_ROWS_EVERY
        #: The step at which W&B next gets rows (a step's end compares it in place).
        self.next_rows_at = start_step + self.every

    def step_closed(self, step: int, global_step: int, recent: Any, memory_latest: dict[str, Any] | None) -> None:
        """A step ended (training thread): every ``wandb_log_every`` steps, the rows of the steps since."""
        if self.wandb is None or step < self.next_rows_at:
            return
        every = self.every
        self.next_rows_at = step + every
        self.wandb.log_steps(global_step, list(recent)[-every:], memory_latest)

    def window_written(self, global_step: int, report: dict[str, Any]) -> None:
        """A window's report was written (writer thread): its row and the diagnoses table."""
        written = [w for w in report["windows"] if not w.get("pruned")]
        if self.wandb is not None and written:
            self.wandb.log_window(global_step, written[-1], report["diagnoses"])

    def early_answer(self, global_step: int, report: dict[str, Any]) -> None:
        """The run's first answer, before any window (writer thread): the verdicts its settings, recipe and first
        steps give, printed once (rank 0) and logged to W&B as the diagnoses table."""
        diagnoses = report.get("diagnoses") or []
        if not diagnoses:
            return
        if self.wandb is not None:
            self.wandb.log_diagnoses(global_step, diagnoses)
        if self.rank == 0 and self.config.console:
            print(fresh_line() + early_lines(report, self.output_dir), file=sys.stderr, flush=True)

    def close(self, global_step: int, report: dict[str, Any], run_report: dict[str, Any] | None,
              recent: list[StepTiming], memory_latest: dict[str, Any] | None, timeout_s: float) -> None:
        """The last W&B row, table, summary and files (with the run's merged report on a multi-rank run); the
        ``wandb`` section of ``report``."""
        sink = self.wandb
        if sink is None:
            return
        run_report = run_report or report
        html = render_html(run_report, series=report.get("series"), base=self.output_dir)
        sink.close(global_step, run_report, recent[-self.every:], memory_latest, html,
                   timeout_s=timeout_s)
        if sink.run is not None or sink.failed:
            report["wandb"] = sink.section()

    def stalled(self, records: list[dict[str, Any]]) -> None:
        """A stall opened (the live watch's thread): a W&B alert naming the rank, phase and line."""
        if self.wandb is None or not records or records[-1].get("ended"):
            return
        stall = records[-1]
        where = f" at {stall['stack'][-1]}" if stall.get("stack") else ""
        self.wandb.alert(f"perfhooks: rank {stall['rank']} stalled in {stall['phase']}",
                         f"rank {stall['rank']} has been in {stall['phase']} for {stall['seconds']:.0f} s at step "
                         f"{stall['step']}{where}; device queue: {stall.get('device')}")

    def print_table(self, report: dict[str, Any], run_report: dict[str, Any] | None) -> None:
        """The end-of-run table on standard error (rank 0), with the verdicts only the ranks together give."""
        if self.rank == 0:
            print(fresh_line() + format_table(with_cross_rank_verdicts(report, run_report)), file=sys.stderr)

    def release(self) -> None:
        self.wandb = None


def with_cross_rank_verdicts(report: dict[str, Any], run_report: dict[str, Any] | None) -> dict[str, Any]:
    """This rank's report with the verdicts only the ranks together give (a straggler), and the ranks' merged
    trace, from the run's merged report, for the printed table."""
    run_report = run_report or {}
    merged = run_report.get("diagnoses") or []
    if any(d["id"] in CROSS_RANK for d in merged):
        report = {**report, "diagnoses": with_cross_rank(report["diagnoses"], merged, CROSS_RANK)}
    if run_report.get("merged_trace"):
        report = {**report, "merged_trace": run_report["merged_trace"]}
    return report


def existing_ancestor(path: Path) -> Path | None:
    """``path`` or its nearest existing parent (None when even the root is not there): once the user removes it,
    nothing is written."""
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            return candidate
    return None
