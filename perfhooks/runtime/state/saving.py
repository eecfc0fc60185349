"""Reports written while the run goes on: at each capture window's end, every ``report_every_s`` seconds, and at
once when a signal ends the process.

The training thread only publishes the run's state (:meth:`~perfhooks.runtime.engine.Engine.publish`); the writer
thread builds the report from that state and writes it, atomically. A window's report waits for the window's
trace to be written and analysed (the writer runs its jobs in order), so it carries the window's verdicts.

Threading: :meth:`ReportSaving.window_written` runs on the writer thread and swaps in the window's verdicts as
one value; everything else runs on the training thread (or, for :meth:`ReportSaving.write_now`, on the signal
helper's thread or the live watch's).

A signal's report is the last word until the run closes: a write of the writer's from a state published before
the signal must not replace it. ``write_report`` reads the file on disk and does not put a ``running`` report over
a ``terminated`` one, but that read and the write are two steps: a writer between them when the signal's report
was written (under load, it was) would replace it. So the writer's writes and :meth:`ReportSaving.write_now` hold
one lock around the whole read-and-write. The training thread never takes it: a signal handler there cannot wait
on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.capture.window_job import analyze_window
from perfhooks.faults import FaultLog
from perfhooks.files.writer import BackgroundWriter
from perfhooks.rules.thresholds import Thresholds
from perfhooks.runtime.capture_control import CaptureControl
from perfhooks.runtime.state.outputs import RunOutputs
from perfhooks.runtime.state.run_state import RunState, TraceVerdicts
from perfhooks.timebase import monotonic_ns

Write = Callable[[Path, dict[str, Any]], Any]
#: Seconds :meth:`ReportSaving.write_now` waits for a write of the writer's under way, before it writes regardless.
WRITE_WAIT_S = 2.0


class ReportSaving:
    """The report's writes during the run, and the latest analysed window's verdicts."""

    def __init__(self, output_dir: Path, every_s: float, thresholds: Thresholds, writer: BackgroundWriter,
                 capture: CaptureControl, outputs: RunOutputs, faults: FaultLog,
                 publish: Callable[[bool], RunState], build: Callable[[RunState], dict[str, Any]],
                 write: Write, on_verdicts: Callable[[], None] = lambda: None) -> None:
        self.output_dir = output_dir
        self.thresholds = thresholds
        self.writer = writer
        self.capture = capture
        self.outputs = outputs
        self.faults = faults
        self.publish = publish
        self.build = build
        self.write = write
        #: Called (on the writer thread) when a window's verdicts were swapped in: the next step publishes them.
        self.on_verdicts = on_verdicts
        #: The latest analysed window's verdicts (the writer thread swaps them in, as one value).
        self.trace = TraceVerdicts()
        #: A signal's handler saves the window and writes the report itself: no write follows the window.
        self.suspended = False
        self.every_ns = int(every_s * 1e9)
        #: ``monotonic_ns()`` of the next periodic write, every ``report_every_s``: a step's end compares it in
        #: place (:meth:`RunParts.step_closed`) and calls :meth:`save` when it is due.
        self.next_ns = monotonic_ns() + self.every_ns
        #: Held around each file write of the writer's and of :meth:`write_now`; never by the training thread.
        self._file_lock = threading.Lock()

    def _write_in_turn(self, report: dict[str, Any]) -> None:
        """The writer thread's write of ``report`` (the file is read and written with no other write between)."""
        with self._file_lock:
            self.write(self.output_dir, report)

    def window_written(self, path: Path, window: dict[str, Any]) -> None:
        """On the writer thread, after a window's trace is written: its metrics and verdicts."""
        try:
            metrics, diagnoses = analyze_window(path, self.thresholds, window["first_step"],
                                                partial_step=window.get("partial_step"))
        except Exception as error:
            self.faults.report("window_analysis", error)
            return
        self.capture.windows.update(window, metrics=metrics)
        self.trace = TraceVerdicts(tuple(diagnoses), window["last_step"] - window["first_step"] + 1)
        self.on_verdicts()

    def window_saved(self) -> None:
        """A window's trace was handed to the writer: the report follows it, with the window's row for W&B."""
        if not self.suspended:
            self.save(window=True)

    def save(self, window: bool, early: bool = False) -> None:
        """Publish the state now; the writer builds and writes its report (with the window's verdicts). ``early``:
        the run's first answer, before any window (its verdicts go to the console and W&B too)."""
        self.next_ns = monotonic_ns() + self.every_ns
        state = self.publish(True)

        def write() -> None:
            report = self.build(state.with_parts(windows=tuple(self.capture.windows.snapshot()), trace=self.trace))
            self._write_in_turn(report)
            if window:
                self.outputs.window_written(state.global_step, report)
            if early:
                self.outputs.early_answer(state.global_step, report)

        self.writer.submit("report_write", write)

    def write_now(self, state: RunState, wait_s: float = WRITE_WAIT_S) -> dict[str, Any]:
        """Build and write the report of ``state`` here, now (the signal helper's thread, or the watch's: never
        the training thread). A write of the writer's under way is waited for, at most ``wait_s`` seconds."""
        report = self.build(state.with_parts(windows=tuple(self.capture.windows.snapshot()), trace=self.trace))
        held = self._file_lock.acquire(timeout=max(0.0, wait_s))
        try:
            self.write(self.output_dir, report)
        finally:
            if held:
                self._file_lock.release()
        return report
