"""A run's life, in one place: start, close, exception, abandon and the exit guard.

- **start** (:func:`begin`, from ``Engine.__init__``): the engine becomes the process's current run. A
  previous run still open ended without its end event (the HF Trainer's ``auto_find_batch_size`` retry, an OOM
  the caller caught, a notebook cell re-run): it is abandoned first, so its profiler session, hooks and threads
  are gone before the new run starts. The exit guard is installed once per process.
- **close** (:func:`close`, once per run; ``Engine.close``):
  1. the open step: an aside cut short ends; a step whose optimizer stepped is counted; one cut short is not.
     The run account stops;
  2. the device gets until the deadline to finish what was queued (``query()`` polled, never a blocking sync);
     then the profiler window stops (its partial trace is saved; ``profiler.stop()`` syncs, so not before) and
     pending device timings are read. Steps the device did not finish are reported, not waited for. None of
     this happens after a CUDA error (the context may be broken): no device call is made from then on;
  3. hooks, the on-demand trigger and the writer thread end (the writer within the deadline);
  4. the report is built; memory history stops; rank 0 may wait for the other ranks' summaries; W&B gets its last
     row, table and summary; ``report.json`` (and the merged report) are written; the table is printed;
  5. everything that refers to the user's objects, and process-wide state, is let go (:func:`end`).
- **exception** (:func:`fail`; ``Engine.exception``): the user's error is on its way out. It is noted (an OOM
  dump is written while memory is as the error left it) and the run closes as ``failed``. After a close (an
  error in a later ``on_train_end``), the report on disk is rewritten as ``failed``. The error propagates
  unchanged: nothing here raises.
- **abandon** (:func:`abandon`): the run ended without its end event; it closes, as ``failed`` when it saw an
  error or its framework always ends runs explicitly.
- **exit**: on an uncaught exception the previous ``sys.excepthook`` prints the user's traceback *first*, then
  the current run fails within :data:`EXIT_DEADLINE_S`; at interpreter exit a run still open is abandoned within
  the same deadline (with its table when it saw no error and its framework does not end runs explicitly: an
  accelerate session never closed). The traceback, exit status and last stderr line are the program's own.

Every part is guarded: a fault is reported once and the rest goes on. A ``deadline_s`` bounds the waits.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any

from perfhooks.analysis.merge_traces import merge_traces
from perfhooks.capture.windows import trace_name
from perfhooks.memory.oom import is_cuda_error
from perfhooks.report import store as rank_store
from perfhooks.report.merge import merge_rank_reports, merge_summaries, rank_summary
from perfhooks.report.write import rank_reports, write_merged_report, write_report, write_run_report
from perfhooks.rules.ranks import CROSS_RANK
from perfhooks.rules.verdicts import rank as rank_verdicts
from perfhooks.sinks.console import format_table, fresh_line
from perfhooks.sinks.html import render_html

if TYPE_CHECKING:
    from perfhooks.runtime.engine import Engine

#: Seconds the logging rank waits, at the end, for the other ranks' reports to attach to W&B.
RANK_WAIT_S = 10.0

#: Seconds the writer thread gets to finish its queue (trace exports, reports) at a normal end.
WRITER_WAIT_S = 60.0

#: Seconds W&B gets to take its last rows and files at a normal end.
WANDB_WAIT_S = 30.0
#: Seconds the device gets to finish the work queued before the close (pending step timings, the open window),
#: polled: a hung kernel or a collective whose peer died costs this much, never more.
DEVICE_WAIT_S = 30.0


class Deadline:
    """Seconds left of an optional total budget."""

    def __init__(self, seconds: float | None) -> None:
        self._end = None if seconds is None else time.monotonic() + seconds

    def left(self, cap: float) -> float:
        """At most ``cap`` seconds, and no more than what is left (never negative)."""
        if self._end is None:
            return cap
        return max(0.0, min(cap, self._end - time.monotonic()))


def _finish(engine: Engine, deadline: Deadline) -> dict[str, Any] | None:
    """Steps 1-4 of :func:`close`, each guarded; the final report."""
    guarded = engine.guarded_call
    guarded("close_step", engine.end_open_step)
    engine.account.close()
    if not engine.cuda_broken:
        device_deadline = time.monotonic() + deadline.left(DEVICE_WAIT_S)
        if guarded("device_drain", lambda: engine.room.drained(device_deadline)):
            guarded("window_close", engine.windows.close)  # profiler.stop() syncs: only once the device is done
        else:
            engine.once.warn("device_busy", f"the device did not finish its queued work within "
                             f"{deadline.left(DEVICE_WAIT_S):.0f} s of the close (a hung kernel, or a collective "
                             "waiting for a peer): the open capture window is not saved")
            guarded("window_abandon", engine.windows.abandon)
        guarded("flush_timings", lambda: engine.pending.drain(engine.stats, deadline=device_deadline))
        if engine.pending.unfinished:
            engine.once.warn("steps_unfinished", f"{engine.pending.unfinished} step(s) had not finished on the device "
                             "by the close's deadline: not counted")
    engine.hooks.remove()
    if engine.all_ranks is not None:
        guarded("trigger_close", engine.all_ranks.close)
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
        if run_report is not None:
            run_report["merged_trace"] = guarded("trace_merge", lambda: merge_rank_traces(engine, report))
    if engine.wandb is not None:
        guarded("wandb_close", lambda: close_wandb(engine, report, deadline, run_report))
    if engine.output_removed():  # never make again a folder the user removed
        engine.once.warn("output_removed", f"{engine.output_anchor} was removed during the run; the report "
                         f"({engine.output_dir / 'report.json'}) is not written")
    else:
        _write_reports(engine, report, store, run_report)
    if engine.console and engine.rank == 0:
        print(fresh_line() + format_table(with_cross_rank_verdicts(report, run_report)), file=sys.stderr)
    return report


#: The ranks' traces rank 0 merges at the close when they are all in its folder, at most this many bytes in all
#: (compressed): about 2 s of merging here (2 ranks of 216k events, 5.2 MB, took 3.4 s).
MERGE_AT_CLOSE_BYTES = 4 * 2**20


def merge_rank_traces(engine: Engine, report: dict[str, Any]) -> dict[str, Any] | None:
    """Rank 0, at the close: merge every rank's trace of its latest window when its folder holds them all (a shared
    folder); else say which command merges them once gathered. None when no window was written."""
    windows = [w for w in report.get("windows") or [] if not w.get("pruned")]
    if not windows:
        return None
    step = windows[-1]["first_step"]
    traces = engine.output_dir / "traces"
    files = [traces / trace_name(r, step) for r in range(engine.world_size)]
    absent = [r for r, path in enumerate(files) if not path.exists()]
    command = (f"perfhooks merge-traces <each rank's {engine.output_dir.name}/traces folder> --step {step} "
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
    result = merge_traces([str(path) for path in files], engine.output_dir / "merged" / f"step{step}.pt.trace.json.gz",
                          max_bytes=engine.config.max_trace_bytes)
    return {"path": str(result.path), "first_step": step, "ranks": result.ranks, "steps": result.steps,
            "clock": {str(rank): offset.as_dict() for rank, offset in result.offsets.items()},
            "warnings": result.warnings}


def with_cross_rank_verdicts(report: dict[str, Any], run_report: dict[str, Any] | None) -> dict[str, Any]:
    """This rank's report with the verdicts only the ranks together give (a straggler), and the ranks' merged
    trace, from the run's merged report, for the printed table."""
    run_report = run_report or {}
    cross = [d for d in run_report.get("diagnoses") or [] if d["id"] in CROSS_RANK]
    if cross:
        report = {**report, "diagnoses": rank_verdicts(cross + list(report["diagnoses"]))}
    if run_report.get("merged_trace"):
        report = {**report, "merged_trace": run_report["merged_trace"]}
    return report


def _write_reports(engine: Engine, report: dict[str, Any], store: Any, run_report: dict[str, Any] | None) -> None:
    guarded = engine.guarded_call
    guarded("report_write", lambda: write_report(engine.output_dir, report))
    if store is not None:  # rank 0 merged the store's summaries
        if run_report is not None:
            guarded("report_merge", lambda: write_run_report(engine.output_dir, run_report))
    elif engine.world_size > 1:  # no process group: the last rank to finish merges the folder's reports
        guarded("report_merge", lambda: write_merged_report(engine.output_dir, engine.world_size,
                                                              engine.config.thresholds))


def gather_ranks(engine: Engine, report: dict[str, Any], deadline: Deadline, store: Any
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


def close_wandb(engine: Engine, report: dict[str, Any], deadline: Deadline,
                run_report: dict[str, Any] | None = None) -> None:
    """The last W&B row, table, summary and files (with the run's merged report on a multi-rank run); the
    ``wandb`` section of the report."""
    sink = engine.wandb
    assert sink is not None
    recent = list(engine.stats.recent)[-engine.config.wandb_log_every:]
    latest = engine.memory.latest if engine.memory is not None else None
    run_report = run_report or report
    sink.close(engine.global_step, run_report, recent, latest, render_html(run_report, series=report.get("series"),
                                                                         base=engine.output_dir),
               timeout_s=deadline.left(WANDB_WAIT_S))
    if sink.run is not None or sink.failed:
        report["wandb"] = sink.section()


# ----------------------------------------------------------------------------- close, exception, abandon
def close(engine: Engine, deadline_s: float | None = None) -> dict[str, Any] | None:
    """End of training (once): the report, the table, every resource released. ``deadline_s`` bounds the waits
    (writer, W&B, other ranks) in total. The final report, or None when the run was already closed."""
    if engine._closed:
        return None
    engine._closed = True
    if engine.status == "running":
        engine.status = "completed"
    report = None
    try:
        report = _finish(engine, Deadline(deadline_s))
    except Exception as error:
        engine.faults.report("close", error)
    finally:
        _release(engine)
    engine.final_report = report
    return report


def note_error(engine: Engine, error: BaseException) -> None:
    """An error passed through a wrapper of perfhooks' (the caller may yet catch it): remember it for the report
    and, when it is an OOM, write the dump now, while memory is as the error left it."""
    try:
        if engine._closed or error is engine._error_seen:
            return
        engine._error_seen = error
        if engine._flops_watch:
            engine._stop_counting(keep=False)
        phase = engine.open_phase
        engine.error = error_entry(engine, error, phase)
        if is_cuda_error(error):
            engine.cuda_broken = True
            engine.clock.stop_device()
        elif engine.memory is not None:
            engine.memory.on_exception(error, engine.step, phase)
    except Exception as fault:
        engine.faults.report("exception", fault)


def fail(engine: Engine, error: BaseException, deadline_s: float | None = None, quiet: bool = False) -> None:
    """The user's error is on its way out: save the partial window and the report as ``failed``. Never raises."""
    try:
        if engine._closed:
            _fail_after_close(engine, error)
            return
        note_error(engine, error)
        engine.status = "failed"
        if quiet:
            engine.console = False
        close(engine, deadline_s)
    except Exception as fault:
        engine.faults.report("exception", fault)


def abandon(engine: Engine, deadline_s: float | None = None, quiet: bool = False) -> None:
    """The run ended without its end event (a caught exception, a retry, the process exiting): close it, as
    ``failed`` when it saw an error or its framework always ends runs explicitly."""
    if engine._closed:
        return
    if engine.error is not None or engine.ends_explicitly:
        engine.status = "failed"
        if engine.error is None:
            engine.error = {"type": "unknown", "message": "the run stopped without ending: an exception that the "
                            "caller caught, or a loop left early", "step": engine.step, "phase": engine.open_phase}
    if quiet:
        engine.console = False
    close(engine, deadline_s)


def error_entry(engine: Engine, error: BaseException, phase: str | None) -> dict[str, Any]:
    """The report's ``error``: the user's exception, where it struck."""
    return {"type": type(error).__name__, "message": str(error)[:500], "step": engine.step, "phase": phase}


def _fail_after_close(engine: Engine, error: BaseException) -> None:
    report = engine.final_report
    if report is None or report.get("status") == "failed":
        return
    engine.status = report["status"] = "failed"
    engine.error = report["error"] = error_entry(engine, error, "after training")
    if not engine.output_removed():
        write_report(engine.output_dir, report)


def _release(engine: Engine) -> None:
    """Step 5: let go of everything that refers to the user's objects and of process-wide state."""
    try:
        engine.hooks.remove()
        engine.compile_watch.remove()
        if engine.memory is not None:
            engine.memory.release()
        engine.wandb = None
        engine._error_seen = None
    except Exception as error:
        engine.faults.report("release", error)
    finally:
        end(engine)


# ----------------------------------------------------------------------------- the exit guard
#: Seconds perfhooks' exit work may take in total (an uncaught error or interpreter exit).
EXIT_DEADLINE_S = 5.0

_lock = threading.Lock()

_current: weakref.ref[Engine] | None = None

_installed = False

_previous_hook: Any = None


def current() -> Engine | None:
    """The engine of the run in progress in this process, if any."""
    return _current() if _current is not None else None


def begin(engine: Engine) -> None:
    """``engine`` is the process's run from now on; close a previous one that never ended."""
    global _current
    previous = current()
    if previous is not None and previous is not engine and not previous.closed:
        abandon(previous, quiet=True)
    with _lock:
        _current = weakref.ref(engine)
    _install()


def end(engine: Engine) -> None:
    """``engine`` closed: it is no longer the current run."""
    global _current
    with _lock:
        if current() is engine:
            _current = None


def _install() -> None:
    global _installed, _previous_hook
    with _lock:
        if _installed:
            return
        _installed = True
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook
        atexit.register(_at_exit)


def _excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    """The user's traceback first (the hook that was there before), then the run's end."""
    try:
        (_previous_hook or sys.__excepthook__)(kind, error, tb)
    finally:
        engine = current()
        if engine is not None and not engine.closed:
            fail(engine, error, deadline_s=EXIT_DEADLINE_S, quiet=True)


def _at_exit() -> None:
    """A run still open at interpreter exit: a loop that never closed its session (``attach`` without ``with``)
    ends here with its table; one that saw an error, or whose framework always ends its runs, ends quietly."""
    engine = current()
    if engine is not None and not engine.closed:
        abandon(engine, deadline_s=EXIT_DEADLINE_S, quiet=engine.error is not None or engine.ends_explicitly)
