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
"""

from __future__ import annotations

import inspect
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

#: The signals that end a run by default (SLURM's pre-timeout signal is what ``--signal`` names: add it).
TERMINATING = ("SIGTERM", "SIGHUP", "SIGINT")

OnSignal = Callable[[str], None]


class SignalChain:
    """perfhooks' handler for each signal given, chained to the handler it found."""

    def __init__(self, on_signal: OnSignal) -> None:
        #: Called with the signal's name (``SIGTERM``) before the previous handler runs; it must not raise.
        self.on_signal = on_signal
        self._previous: dict[int, Any] = {}
        #: What was found, kept weakly after removal (a handler restored by someone else later still chains to
        #: it, and no handler keeps a framework's trainer alive after the run).
        self._found: dict[int, Callable[[], Any]] = {}

    @property
    def installed(self) -> list[str]:
        return [signal.Signals(signum).name for signum in self._previous]

    def install(self, names: tuple[str, ...]) -> list[str]:
        """Install for each of ``names`` whose handler is chainable; the names installed. Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return []
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
            return
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        try:
            self.on_signal(signal.Signals(signum).name)
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
