"""Open a capture window on demand: touch ``<output_dir>/TRIGGER`` or send SIGUSR2."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from perfhooks.timebase import monotonic_ns

TRIGGER_FILE = "TRIGGER"


class OnDemandTrigger:
    """Polls for the trigger file at most every ``poll_s`` seconds; SIGUSR2 sets a flag at once."""

    def __init__(self, output_dir: Path, poll_s: float = 1.0, use_signal: bool = True) -> None:
        self.path = output_dir / TRIGGER_FILE
        self.poll_s = poll_s
        #: Set by the signal handler and fire(): a plain attribute, since a handler must take no lock.
        self._requested = False
        self._next_poll_ns = 0
        self._previous_handler: Any = None
        self._installed = False
        #: Why SIGUSR2 is not perfhooks' trigger in this run (None when it is, or was not asked for).
        self.signal_skipped: str | None = None
        self._closed = False
        if use_signal and hasattr(signal, "SIGUSR2") and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGUSR2) is None:
                # a handler installed outside Python (a native library, a job launcher's agent): signal.signal
                # could neither chain to it nor put it back, so it stays, and the trigger file is the way in
                self.signal_skipped = ("SIGUSR2 has a handler installed outside Python; perfhooks leaves it in place "
                                       "(touch the TRIGGER file to open a window)")
            else:
                self._previous_handler = signal.signal(signal.SIGUSR2, self._on_signal)
                self._installed = True

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Only sets the flag (then chains to the handler that was there before): no lock, no I/O. After a close
        made off the main thread, it puts the handler back and passes the signal on, as plain."""
        if self._closed:
            installed = signal.getsignal(signal.SIGUSR2) == self._on_signal
            self.close()
            if self._previous_handler == signal.SIG_DFL and installed:  # else the installed handler's to take
                os.kill(os.getpid(), signum)
            elif callable(self._previous_handler):
                self._previous_handler(signum, frame)
            return
        self._requested = True
        self.on_request()
        if callable(self._previous_handler):
            self._previous_handler(signum, frame)

    def fire(self) -> None:
        """Ask for a window from code (what the file and the signal do)."""
        self._requested = True
        self.on_request()

    @staticmethod
    def on_request() -> None:
        """Called at a request (in the signal's handler: it may only set attributes); replaced by the run."""

    def poll(self) -> bool:
        """True once per request; looks for the file at most every ``poll_s`` seconds (a training-thread call)."""
        if not self._requested:  # the signal's flag is taken at once; the file at most every poll_s
            now = monotonic_ns()
            if now < self._next_poll_ns:
                return False
            self._next_poll_ns = now + int(self.poll_s * 1e9)
        return self.take()

    @property
    def next_poll_ns(self) -> int:
        """``monotonic_ns()`` from which :meth:`poll` looks for the file again (a signal's request is taken at any
        call)."""
        return self._next_poll_ns

    def take(self) -> bool:
        """True once per request (the signal's flag, or the file, which it removes); no rate limit."""
        if self._requested:
            self._requested = False
            return True
        try:
            self.path.unlink()
        except OSError:  # absent, or the folder is not there/readable: no request
            return False
        return True

    def close(self) -> None:
        """Restore the SIGUSR2 handler that was there (a Python handler, ``SIG_DFL`` or ``SIG_IGN``), only if
        perfhooks' is still the one installed. Off the main thread, its own next call does it."""
        self._closed = True
        if self._installed and threading.current_thread() is threading.main_thread():
            self._installed = False
            if signal.getsignal(signal.SIGUSR2) == self._on_signal:
                signal.signal(signal.SIGUSR2, self._previous_handler)
