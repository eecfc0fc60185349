"""A single background thread for file work (gzip, rename, pruning, reports), off the training thread."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

from perfhooks.faults import FaultLog

Job = Callable[[], None]


class BackgroundWriter:
    """Runs jobs in order on one daemon thread; a bounded queue drops jobs when full (counted)."""

    def __init__(self, faults: FaultLog, capacity: int = 64, name: str = "perfhooks-writer") -> None:
        self.faults = faults
        self.name = name
        self.dropped = 0
        #: Jobs started so far, and whether one is running now: steps that overlap one are marked as
        #: perturbed by perfhooks' own work (it holds the GIL part of the time).
        self.started = 0
        self.running = False
        self._queue: queue.Queue[tuple[str, Job] | None] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None

    def submit(self, kind: str, job: Job) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait((kind, job))
        except queue.Full:
            self.dropped += 1
            self.faults.report(f"{self.name}_queue_full", f"dropped a {kind} job; the {self.name} thread is behind")

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every submitted job ran; False if that took longer than ``timeout_s``."""
        if self._thread is None:
            return True
        done = threading.Event()
        try:
            self._queue.put(("flush", done.set), timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        self.flush(timeout_s)
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=1.0)
            self._thread.join(timeout=1.0)
            self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, job = item
            if kind != "flush":
                self.started += 1
                self.running = True
            try:
                job()
            except Exception as error:
                self.faults.report(kind, error)
            finally:
                self.running = False
