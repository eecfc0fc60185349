"""A run's end, in one place: close, exception and abandon.

The run's start is the engine's constructor, which makes it the process's current run (:mod:`exit_guard`); the
guard ends a run the program never ended. This module knows a run only through the small interface it needs
(:class:`ClosingRun`, which :class:`~perfhooks.runtime.engine.Engine` provides); it imports no engine.

- **close** (:func:`close`, once per run; ``Engine.close``) is one pass down the layers:
  1. *settle*: the open step ends (an aside cut short ends; a step whose optimizer stepped is counted; one cut
     short is not) and the run account stops; the device gets until the deadline to finish what was queued
     (``query()`` polled, never a blocking sync), then the profiler window stops (its partial trace is saved;
     ``profiler.stop()`` syncs, so not before) and pending device timings are read. Steps the device did not
     finish are reported, not waited for. None of this touches the device after a CUDA error. Hooks, triggers
     and the writer thread end (the writer within the deadline);
  2. *snapshot*: the run publishes its final state;
  3. *report*: the report is built from that state; memory history stops;
  4. *ranks*: rank 0 may gather the other ranks' summaries and merge their traces (:mod:`perfhooks.distributed`);
  5. *write*: ``report.json`` (and the merged report) are written;
  6. *sinks*: W&B gets its last row, table and summary; the table is printed;
  7. everything that refers to the user's objects, and process-wide state, is let go.
- **exception** (:func:`fail`; ``Engine.exception``): the user's error is on its way out. It is noted (an OOM
  dump is written while memory is as the error left it) and the run closes as ``failed``. After a close (an
  error in a later ``on_train_end``), the report on disk is rewritten as ``failed``. The error propagates
  unchanged: nothing here raises.
- **abandon** (:func:`abandon`): the run ended without its end event; it closes, as ``failed`` when it saw an
  error or its framework always ends runs explicitly.

Every part is guarded: a fault is reported once and the rest goes on. A ``deadline_s`` bounds the waits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from perfhooks.config import PerfConfig
from perfhooks.distributed import store as rank_store
from perfhooks.distributed.gather import gather_ranks, merge_rank_traces
from perfhooks.faults import FaultLog, Once
from perfhooks.report import write
from perfhooks.runtime.state.outputs import RunOutputs
from perfhooks.runtime.state.run_state import RunFacts, RunState
from perfhooks.sinks.html import render_html
from perfhooks.timebase import monotonic

#: Seconds the logging rank waits, at the end, for the other ranks' reports to attach to W&B.
RANK_WAIT_S = 10.0
#: Seconds the writer thread gets to finish its queue (trace exports, reports) at a normal end.
WRITER_WAIT_S = 60.0
#: Seconds W&B gets to take its last rows and files at a normal end.
WANDB_WAIT_S = 30.0
#: Seconds a signal's handler may take in all: the device's queue, the open window's partial trace, the report.
SIGNAL_DEADLINE_S = 10.0
#: Seconds of a signal's deadline kept for its report's own write (a write of the writer's is waited for until then).
WRITE_MARGIN_S = 1.0
#: Seconds the device gets to finish the work queued before the close (pending step timings, the open window),
#: polled: a hung kernel or a collective whose peer died costs this much, never more.
DEVICE_WAIT_S = 30.0


class ClosingRun(Protocol):
    """What the lifecycle needs of a run (the engine's public face for its end)."""

    config: PerfConfig
    facts: RunFacts
    faults: FaultLog
    once: Once
    output_dir: Path
    output_anchor: Path | None
    outputs: RunOutputs
    status: str
    #: The signal that ended the run, once one arrived.
    signal: str | None
    #: The run as last published, and the part that writes reports during the run.
    state: RunState
    saving: Any
    error: dict[str, Any] | None
    ends_explicitly: bool
    console: bool
    final_report: dict[str, Any] | None
    #: The memory monitor (``latest``: the last sample), or None.
    memory: Any
    #: The run's owner (:class:`~perfhooks.runtime.ending.orphans.OwnerWatch`): its step counter, whether it is gone.
    owner: Any

    @property
    def closed(self) -> bool: ...
    @property
    def step(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    @property
    def open_phase(self) -> str | None: ...

    def begin_close(self) -> bool: ...
    def settle(self, device_deadline: float, writer_timeout_s: float) -> None: ...
    def publish(self, full: bool = False) -> RunState: ...
    def build_report(self, state: RunState) -> dict[str, Any]: ...
    def stop_memory(self) -> None: ...
    def last_live(self, state: RunState) -> None: ...
    def note_error(self, error: BaseException) -> None: ...
    def stop_window(self, device_deadline: float) -> Any: ...
    @property
    def window_open(self) -> bool: ...
    def output_removed(self) -> bool: ...
    def release(self) -> None: ...



def settle_device(capture: Any, tracker: Any, room: Any, deadline: float, once: Once, faults: FaultLog) -> None:
    """The close: the device gets until ``deadline`` (``time.monotonic()``) to finish its queued work
    (``query()`` polled, never a blocking sync); then the window stops (``profiler.stop()`` syncs, so not
    before) and the pending step timings are read. What the device did not finish is said, not waited for."""
    budget_s = max(0.0, deadline - monotonic())
    if faults.call("device_drain", lambda: room.drained(deadline)):
        faults.call("window_close", capture.windows.close)
    else:
        once.warn("device_busy", f"the device did not finish its queued work within {budget_s:.0f} s of the "
                  "close (a hung kernel, or a collective waiting for a peer): the open capture window is not saved")
        faults.call("window_abandon", capture.windows.abandon)
    pending, stats = tracker.pending, tracker.stats
    faults.call("flush_timings", lambda: pending.drain(stats, deadline=deadline))
    if pending.unfinished:
        once.warn("steps_unfinished", f"{pending.unfinished} step(s) had not finished on the device by the "
                  "close's deadline: not counted")


def stop_window_for_signal(capture: Any, saving: Any, room: Any, device_deadline: float, device_broken: bool
                           ) -> Callable[[], None] | None:
    """A signal, in its handler: stop the open window once the device is done (by ``device_deadline``), taking
    no lock; the job that exports its partial trace (on the signal helper's thread), or None. A device that
    does not drain in time leaves the window open (``stop()`` would wait on it). Raises what the stop raised."""
    if not capture.is_open or device_broken or not room.drained(device_deadline):
        return None
    saving.suspended = True  # the signal's own report stands: no window report follows it
    return capture.windows.stop_for_signal()


class Deadline:
    """Seconds left of an optional total budget."""

    def __init__(self, seconds: float | None) -> None:
        self._end = None if seconds is None else monotonic() + seconds

    def left(self, cap: float) -> float:
        """At most ``cap`` seconds, and no more than what is left (never negative)."""
        if self._end is None:
            return cap
        return max(0.0, min(cap, self._end - monotonic()))


# ----------------------------------------------------------------------------- close, exception, abandon
def close(run: ClosingRun, deadline_s: float | None = None) -> dict[str, Any] | None:
    """End of training (once): the report, the table, every resource released. ``deadline_s`` bounds the waits
    (writer, W&B, other ranks) in total. The final report, or None when the run was already closed."""
    if not run.begin_close():
        return None
    report = None
    try:
        report = _finish(run, Deadline(deadline_s))
    except Exception as error:
        run.faults.report("close", error)
    finally:
        run.release()
    run.final_report = report
    return report


def _finish(run: ClosingRun, deadline: Deadline) -> dict[str, Any]:
    """Steps 1-6 of :func:`close`, each guarded; the final report."""
    run.settle(monotonic() + deadline.left(DEVICE_WAIT_S), deadline.left(WRITER_WAIT_S))
    state = run.publish(full=True)
    report = run.build_report(state)
    run.faults.call("live_file", lambda: run.last_live(state))  # perfhooks top: ended, not stale
    run.stop_memory()
    run_report, store = _ranks(run, report, deadline)
    if run.outputs.wandb is not None:  # W&B first: it adds its section to the report that is written
        run.faults.call("wandb_close", lambda: run.outputs.close(
            run.global_step, report, run_report, list(state.stats.thaw().recent),
            run.memory.latest if run.memory is not None else None, deadline.left(WANDB_WAIT_S)))
        report["faults"] = run.faults.as_list()  # a fault of W&B's last rows (its first log call) is the run's too
    if run.output_removed():  # never make again a folder the user removed
        run.once.warn("output_removed", f"{run.output_anchor} was removed during the run; the report "
                      f"({run.output_dir / 'report.json'}) is not written")
    else:
        _write_reports(run, report, store, run_report)
    if run.console:
        run.outputs.print_table(report, run_report)
    return report


def _ranks(run: ClosingRun, report: dict[str, Any], deadline: Deadline) -> tuple[dict[str, Any] | None, Any]:
    """Rank 0's merged report of every rank (None elsewhere) and the process group's store (None without one)."""
    facts = run.facts
    if facts.world_size <= 1:
        return None, None
    store = run.faults.call("rank_store", rank_store.default_store)
    wandb = run.outputs.wandb
    run_report = run.faults.call("rank_merge", lambda: gather_ranks(
        report, rank=facts.rank, world_size=facts.world_size, output_dir=run.output_dir,
        thresholds=run.config.thresholds, store=store, wait_s=deadline.left(RANK_WAIT_S), once=run.once,
        logs_to_wandb=lambda: wandb is not None and bool(wandb.resolve())))
    if run_report is not None:
        run_report["merged_trace"] = run.faults.call("trace_merge", lambda: merge_rank_traces(
            report, output_dir=run.output_dir, world_size=facts.world_size,
            max_trace_bytes=run.config.max_trace_bytes))
    return run_report, store


def _write_reports(run: ClosingRun, report: dict[str, Any], store: Any, run_report: dict[str, Any] | None) -> None:
    guarded = run.faults.call
    guarded("report_write", lambda: write_report(run.output_dir, report))
    if store is not None:  # rank 0 merged the store's summaries
        if run_report is not None:
            guarded("report_merge", lambda: write.write_run_report(run.output_dir, run_report, render_html))
    elif run.facts.world_size > 1:  # no process group: the last rank to finish merges the folder's reports
        guarded("report_merge", lambda: write.write_merged_report(run.output_dir, run.facts.world_size,
                                                                  run.config.thresholds, render_html))


def write_report(output_dir: Path, report: dict[str, Any]) -> Path | None:
    """``report.json`` and its ``report.html`` (the one writer, with the HTML sink)."""
    return write.write_report(output_dir, report, render_html)


def terminate(run: ClosingRun, name: str, busy: bool, helper: Helper, deadline_s: float = SIGNAL_DEADLINE_S) -> None:
    """A signal that ends the run arrived (``name``: ``SIGTERM``), in perfhooks' handler on the main thread.

    Nothing here takes a lock: the interrupted thread may hold it. The signal is recorded; the open window's
    profiler is stopped here unless the signal interrupted perfhooks' own lock-holding code (``busy``: then the
    window is left open, and the report says so). ``helper`` runs the rest on its own thread, waited for within
    ``deadline_s``: the report of the last published state, written as ``terminated`` and naming the signal, then
    the window's partial trace. The run stays open: if the process goes on (Lightning stops at its next step),
    its close writes the full report. Never raises."""
    try:
        if run.closed or run.signal is not None:
            return
        run.signal, run.status = name, "terminated"
        deadline = Deadline(deadline_s)
        export, fault = None, None
        if busy:
            if run.window_open:
                run.faults.note("signal_window", "the signal interrupted perfhooks' own lock-holding code, so the "
                                "open capture window was left open and its partial trace not saved")
        else:
            try:
                export = run.stop_window(monotonic() + deadline.left(deadline_s / 2))
            except Exception as error:  # reported on the helper's thread: the fault log has a lock
                fault = error
        state = run.state._replace(status="terminated", signal=name)
        framework = run.owner.step(state.global_step)
        if framework > state.global_step:  # the framework counted a step perfhooks had not yet ended: unfinished
            state = state._replace(global_step=framework).with_parts(
                unfinished_steps=state.parts.unfinished_steps + 1)

        def save() -> None:
            if fault is not None:
                run.faults.report("signal_window", fault)
            if run.output_removed():
                return
            run.saving.write_now(state, wait_s=deadline.left(deadline_s) - WRITE_MARGIN_S)
            if export is not None:
                export()

        helper(save, deadline.left(deadline_s))
    except Exception:  # nothing here may take the fault log's lock
        pass


#: Runs a job on the signal helper's thread and waits for it at most the seconds given; whether it finished.
Helper = Callable[[Callable[[], None], float], bool]


def fail(run: ClosingRun, error: BaseException, deadline_s: float | None = None, quiet: bool = False) -> None:
    """The user's error is on its way out: save the partial window and the report as ``failed``. Never raises."""
    try:
        if run.closed:
            _fail_after_close(run, error)
            return
        run.note_error(error)
        if run.signal is None:  # an error a signal caused (KeyboardInterrupt, Lightning's SIGTERMException) ends it
            run.status = "failed"
        if quiet:
            run.console = False
        close(run, deadline_s)
    except Exception as fault:
        run.faults.report("exception", fault)


def abandon(run: ClosingRun, deadline_s: float | None = None, quiet: bool = False, superseded: bool = False) -> None:
    """The run ended without its end event (a caught exception, a retry, the process exiting): close it, as
    ``failed`` when it saw an error or its framework always ends runs explicitly. ``superseded``: a new run started
    (or this one was left open): W&B gets its end only in the run it found (``wandb.run`` may be the new one's)."""
    if run.closed:
        return
    if (run.error is not None or run.ends_explicitly) and run.signal is None:
        run.status = "failed"
        if run.error is None:
            run.error = {"type": "unknown", "message": "the run stopped without ending: an exception that the "
                         "caller caught, or a loop left early", "step": run.owner.step(run.step),
                         "phase": run.open_phase}
    if quiet:
        run.console = False
    sink = run.outputs.wandb
    if superseded and sink is not None:
        sink.keep_to_its_run()  # a run found now would be the next fit's
    close(run, deadline_s)


def left_open(run: ClosingRun, reason: str, deadline_s: float = SIGNAL_DEADLINE_S) -> None:
    """The run was left open (:mod:`perfhooks.runtime.ending.orphans`; ``reason``: why it is taken so), on the watch
    thread: it closes quietly, as ``failed`` with the error it saw (or one that says why), within ``deadline_s``; a run
    whose framework sends no end event (accelerate) and whose owner was freed with no error seen completed."""
    if run.closed:
        return
    # a loop with no end event of its own (accelerate's) whose owner the program dropped simply ended
    if run.error is None and (run.ends_explicitly or run.owner.gone is None):
        run.error = {"type": "unknown", "message": f"the run was left open: {reason}",
                     "step": run.owner.step(run.step), "phase": run.open_phase}
    abandon(run, deadline_s, quiet=True, superseded=True)


def error_entry(error: BaseException, step: int, phase: str | None) -> dict[str, Any]:
    """The report's ``error``: the user's exception, where it struck."""
    return {"type": type(error).__name__, "message": str(error)[:500], "step": step, "phase": phase}


def _fail_after_close(run: ClosingRun, error: BaseException) -> None:
    report = run.final_report
    if report is None or report.get("status") in ("failed", "terminated"):
        return
    run.status = report["status"] = "failed"
    run.error = report["error"] = error_entry(error, run.step, "after training")
    if not run.output_removed():
        write_report(run.output_dir, report)
