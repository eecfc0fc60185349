"""At the close of a multi-rank run: the ranks' summaries gathered into the run's merged report (rank 0), and the
ranks' traces of the latest window merged onto one timeline when they are all in rank 0's folder.

With a process group every rank publishes its summary in the group's store and rank 0 collects them within a
bound (:func:`perfhooks.distributed.store.collect`: one counter read per wait round, one read of every summary);
without one, the rank that logs to W&B reads the others' ``report.rank{R}.json`` from a shared output folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.analysis.merge_traces import merge_traces
from perfhooks.capture.windows import trace_name
from perfhooks.distributed import store as rank_store
from perfhooks.faults import Once
from perfhooks.report.merge import merge_rank_reports, merge_summaries, rank_summary
from perfhooks.report.write import rank_reports
from perfhooks.rules.thresholds import Thresholds

#: The ranks' traces rank 0 merges at the close when they are all in its folder, at most this many bytes in all
#: (compressed): about 2 s of merging here (2 ranks of 216k events, 5.2 MB, took 3.4 s).
MERGE_AT_CLOSE_BYTES = 4 * 2**20


def gather_ranks(report: dict[str, Any], *, rank: int, world_size: int, output_dir: Path, thresholds: Thresholds,
                 store: Any, wait_s: float, once: Once, logs_to_wandb: Callable[[], bool]
                 ) -> dict[str, Any] | None:
    """The run's merged report on rank 0 (None elsewhere, or when it cannot be had).

    With a process group (``store`` is its key-value store): every rank publishes its summary there; rank 0
    collects the others' within ``wait_s`` and merges what came, listing the rest as missing. Without one: the
    rank that logs to W&B (``logs_to_wandb()``) reads the others' ``report.rank{R}.json`` from the (shared)
    output folder within the wait.
    """
    others = [r for r in range(world_size) if r != rank]
    if store is not None:
        index = rank_store.next_index()
        summary = rank_summary(report)
        rank_store.publish(store, index, rank, summary)
        if rank != 0:
            return None
        summaries, missing = rank_store.collect(store, index, others, wait_s, published=world_size)
        if missing:
            once.warn("ranks_late", f"rank(s) {', '.join(map(str, missing))} sent no summary within "
                                    f"{wait_s:.0f} s; the merged report lists them as missing")
        return merge_summaries(report, [summary, *summaries], thresholds, "store", world_size)
    if not logs_to_wandb():
        return None
    reports = rank_reports(output_dir, others, wait_s=wait_s, final=True)
    if reports is None:
        once.warn("ranks_late", f"not every rank's final report was there within {wait_s:.0f} s; "
                                "W&B gets this rank's figures only")
        return None
    return merge_rank_reports([report, *reports], thresholds)


def merge_rank_traces(report: dict[str, Any], *, output_dir: Path, world_size: int, max_trace_bytes: int
                      ) -> dict[str, Any] | None:
    """Rank 0, at the close: merge every rank's trace of its latest window when its folder holds them all (a shared
    folder); else say which command merges them once gathered. None when no window was written."""
    windows = [w for w in report.get("windows") or [] if not w.get("pruned")]
    if not windows:
        return None
    step = windows[-1]["first_step"]
    traces = output_dir / "traces"
    files = [traces / trace_name(r, step) for r in range(world_size)]
    absent = [r for r, path in enumerate(files) if not path.exists()]
    command = (f"perfhooks merge-traces <each rank's {output_dir.name}/traces folder> --step {step} "
               f"-o merged.step{step}.json.gz")
    if absent:
        return {"path": None, "first_step": step, "command": command,
                "reason": f"rank(s) {', '.join(map(str, absent))} wrote no trace of this window in {traces} "
                          "(node-local folders, or a rank that did not record it)"}
    size = sum(path.stat().st_size for path in files)
    if size > MERGE_AT_CLOSE_BYTES:
        return {"path": None, "first_step": step, "command": command,
                "reason": f"the ranks' traces take {size} bytes, more than the {MERGE_AT_CLOSE_BYTES} merged at the "
                          "close; merge them after the run"}
    result = merge_traces([str(path) for path in files], output_dir / "merged" / f"step{step}.pt.trace.json.gz",
                          max_bytes=max_trace_bytes)
    return {"path": str(result.path), "first_step": step, "ranks": result.ranks, "steps": result.steps,
            "clock": {str(rank): offset.as_dict() for rank, offset in result.offsets.items()},
            "warnings": result.warnings}
