"""Signals that end a run (a time limit, preemption, ``scancel``, Ctrl-C): the run's report is saved first, then
the handler that was there before runs, or the signal's default action, so the exit status is the program's own.

One handler per signal and process, installed from the main thread when a run starts (Python runs signal
handlers there) and chained to the one it found, as Lightning's ``_SignalConnector`` composes its own:

- a Python handler found (Lightning's, accelerate's, the user's, ``default_int_handler`` for SIGINT) is called
  after perfhooks' work, with the same arguments;
- ``SIG_DFL``: the default action is taken again (the handler is put back and the signal re-sent), so the
  process ends by the signal, with the status it would have had (-15, 143 in a shell). When perfhooks' handler
  is not the one installed any more (another handler, e.g. Lightning's, installed later, calls it as part of its
  own), the default action is that handler's to take, not perfhooks';
- ``SIG_IGN`` or a handler installed outside Python (``getsignal`` gives None): perfhooks installs nothing.

At the run's end perfhooks' handler is removed only where it is still the one installed: a handler installed
after it is left alone. A handler left behind (Lightning's teardown can restore it) passes the signal on.

**The handler takes no lock.** The thread it interrupted may hold any lock (the writer queue's, the fault log's,
the interpreter's own stderr buffer), and a handler that waits on one waits for ever. So the handler only records
the signal and, when the interrupted frames hold none of perfhooks' locks (:mod:`perfhooks.locks`), stops the open
window's profiler. The saving (the report, the window's trace) runs on :class:`SignalHelper`'s thread, started
with the run and woken through a pipe (``os.write``: no lock); the handler waits for it with a bounded poll
(``sleep``, no lock), then chains. A helper that meets a lock the interrupted thread holds is only waited for
until the deadline: the signal still takes its course.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from perfhooks.timebase import monotonic, sleep

#: The signals that end a run by default (SLURM's pre-timeout signal is what ``--signal`` names: add it).
TERMINATING = ("SIGTERM", "SIGHUP", "SIGINT")

#: Called with the signal's name and the interrupted frame.
OnSignal = Callable[[str, FrameType | None], None]
#: Seconds between the handler's looks at whether the helper is done.
POLL_S = 0.005


class SignalChain:
    """perfhooks' handler for each signal given, chained to the handler it found."""

    def __init__(self, on_signal: OnSignal) -> None:
        #: Called with the signal's name (``SIGTERM``) and the interrupted frame before the previous handler runs;
        #: it must not raise, nor take a lock.
        self.on_signal = on_signal
        self._previous: dict[int, Any] = {}
        #: What was found, kept weakly after removal (a handler restored by someone else later still chains to
        #: it, and no handler keeps a framework's trainer alive after the run).
        self._found: dict[int, Callable[[], Any]] = {}
        #: A removal asked off the main thread (a run closed on the watch thread): done by the main thread at the
        #: next install, or by the handler itself when a signal comes (then it passes the signal on, as plain).
        self._remove_pending = False

    @property
    def installed(self) -> list[str]:
        return [signal.Signals(signum).name for signum in self._previous]

    def install(self, names: tuple[str, ...]) -> list[str]:
        """Install for each of ``names`` whose handler is chainable; the names installed. Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return []
        if self._remove_pending:
            self.remove()
        for name in names:
            signum = signal.Signals[name]
            current = signal.getsignal(signum)
            if signum in self._previous or current is self._handle:
                continue
            if current is None or current == signal.SIG_IGN:  # a C-level handler, or an ignored signal
                continue
            self._previous[signum] = current
            self._found[signum] = _weak(current)
            signal.signal(signum, self._handle)
        return self.installed

    def remove(self) -> None:
        """Put back each handler found, where perfhooks' is still the one installed."""
        if threading.current_thread() is not threading.main_thread():
            self._remove_pending = bool(self._previous)
            return
        self._remove_pending = False
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._remove_pending:  # the run is over: put the handlers back, and the signal goes on as plain
            previous = self._previous.get(signum, signal.SIG_DFL)
            installed = signal.getsignal(signum) == self._handle
            self.remove()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL and installed:
                os.kill(os.getpid(), signum)  # the default action, now that it is installed again
            return
        try:
            self.on_signal(signal.Signals(signum).name, frame)
        finally:
            self._chain(signum, frame)

    def _chain(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum)
        if previous is None:
            found = self._found.get(signum)
            previous = found() if found is not None else None
            previous = signal.SIG_DFL if previous is None else previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL and signal.getsignal(signum) == self._handle:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)  # the default action: the process ends by the signal


def _weak(handler: Any) -> Callable[[], Any]:
    """A reference to ``handler`` that does not keep it (and what it refers to) alive, where one can be made."""
    try:
        reference = weakref.WeakMethod(handler) if inspect.ismethod(handler) else weakref.ref(handler)
    except TypeError:  # SIG_DFL, a builtin such as default_int_handler: nothing of the user's to keep
        return lambda: handler
    return reference


class SignalHelper:
    """A thread that does a terminating signal's saving off the interrupted thread, woken without a lock.

    Started (main thread) when a run installs its handlers and stopped when it ends: between runs no thread of
    perfhooks' is left. It blocks in ``os.read`` on a pipe; the handler hands it one job through an attribute and
    a byte written to the pipe (non-blocking), then polls for the job's ticket.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._wake = -1
        self._job: tuple[int, Callable[[], None]] | None = None
        self._asked = 0
        #: The ticket of the last job finished (the handler polls it).
        self.done = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        read, self._wake = os.pipe()
        os.set_blocking(self._wake, False)
        self._thread = threading.Thread(target=self._run, args=(read,), name="perfhooks-signal", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """End the thread (a job under way gets ``timeout_s``)."""
        thread, wake, self._thread, self._wake = self._thread, self._wake, None, -1
        if thread is None:
            return
        with contextlib.suppress(OSError):
            os.write(wake, b"q")
        thread.join(timeout_s)
        with contextlib.suppress(OSError):
            os.close(wake)

    def run(self, job: Callable[[], None], wait_s: float) -> bool:
        """From a signal handler: run ``job`` on the helper's thread and wait for it, at most ``wait_s`` seconds;
        whether it finished. Takes no lock."""
        if self._wake < 0:
            return False
        self._asked += 1
        ticket = self._asked
        self._job = (ticket, job)
        try:
            os.write(self._wake, b"j")
        except OSError:  # a full pipe, or closed: the job is not run
            return False
        end = monotonic() + wait_s
        while self.done < ticket and monotonic() < end:
            sleep(POLL_S)
        return self.done >= ticket

    def _run(self, read: int) -> None:
        try:
            while True:
                try:
                    byte = os.read(read, 1)
                except OSError:
                    return
                if byte != b"j":
                    return
                taken, self._job = self._job, None
                if taken is None:
                    continue
                ticket, job = taken
                try:
                    job()
                except BaseException:  # the job reports its own faults; the thread must not die
                    pass
                finally:
                    self.done = ticket
        finally:
            with contextlib.suppress(OSError):
                os.close(read)
