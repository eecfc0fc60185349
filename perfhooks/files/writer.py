"""A single background thread for file work (gzip, rename, pruning, reports), off the training thread."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

from perfhooks.faults import FaultLog
from perfhooks.locks import holds_lock
from perfhooks.timebase import monotonic

Job = Callable[[], None]


class BackgroundWriter:
    """Runs jobs in order on one daemon thread; a bounded queue drops jobs when full (counted)."""

    def __init__(self, faults: FaultLog, capacity: int = 64, name: str = "perfhooks-writer",
                 output_removed: Callable[[], bool] | None = None) -> None:
        self.faults = faults
        #: Whether the user removed the output folder during the run: then no job runs (a write would make the
        #: folder, and its parents, again: a deleted TemporaryDirectory's cleanup would then fail).
        self.output_removed = output_removed
        self.name = name
        self.dropped = 0
        #: Jobs started so far, and whether one is running now: steps that overlap one are marked as
        #: perturbed by perfhooks' own work (it holds the GIL part of the time).
        self.started = 0
        self.running = False
        self._queue: queue.Queue[tuple[str, Job] | None] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None
        #: Set when a close ran out of time: jobs still queued are dropped rather than run late.
        self._discard = threading.Event()
        self._capacity = capacity

    @holds_lock
    def submit(self, kind: str, job: Job) -> None:
        if self._thread is None:
            # each thread has its own queue and discard flag: a thread let go of at a timed-out close drains
            # (dropping) its own queue, never a later one's
            self._queue, self._discard = queue.Queue(maxsize=self._capacity), threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._queue, self._discard), name=self.name,
                                            daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait((kind, job))
        except queue.Full:
            self.dropped += 1
            self.faults.report(f"{self.name}_queue_full", f"dropped a {kind} job; the {self.name} thread is behind")

    @holds_lock
    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every submitted job ran; False if that took longer than ``timeout_s`` (one deadline for the
        queue's room and the jobs both)."""
        if self._thread is None:
            return True
        deadline = monotonic() + timeout_s
        done = threading.Event()
        try:
            self._queue.put(("flush", done.set), timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(max(0.0, deadline - monotonic()))

    @holds_lock
    def close(self, timeout_s: float = 60.0) -> None:
        """Run what was submitted, within ``timeout_s``; past it, the jobs still queued are dropped, not run late
        (a late report write would land after the final one), and the thread is let go of."""
        late = not self.flush(timeout_s)
        if late:
            self._discard.set()
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=0.0 if late else 1.0)
            self._thread.join(timeout=0.0 if late else 1.0)
            self._thread = None

    def _removed(self) -> bool:
        try:
            return self.output_removed is not None and self.output_removed()
        except Exception:
            return False

    def _run(self, jobs: queue.Queue[tuple[str, Job] | None], discard: threading.Event) -> None:
        while True:
            try:
                item = jobs.get(timeout=1.0) if discard.is_set() else jobs.get()
            except queue.Empty:  # let go of at a timed-out close, and drained: the thread ends
                return
            if item is None:
                return
            kind, job = item
            if kind != "flush" and (discard.is_set() or self._removed()):
                self.dropped += 1
                continue
            if kind != "flush":
                self.started += 1
                self.running = True
            try:
                job()
            except Exception as error:
                self.faults.report(kind, error)
            finally:
                self.running = False
