"""The exit guard: the process's current run, and its end when the program ends without ending it.

- On an uncaught exception the previous ``sys.excepthook`` prints the user's traceback *first*, then the current
  run fails within :data:`EXIT_DEADLINE_S`.
- At interpreter exit a run still open is abandoned within the same deadline (with its table when it saw no
  error and its framework does not end runs explicitly: an accelerate session never closed).
- A child forked from this process (``multiprocessing``'s fork, accelerate's ``debug_launcher``) starts with no
  current run: the parent's is the parent's. A run the child begins ends at the child's normal exit, which
  ``multiprocessing`` makes with ``os._exit`` after its own exit handlers (a ``multiprocessing.util.Finalize``),
  where ``atexit`` never runs.

- On a signal that ends the run (:mod:`perfhooks.runtime.ending.signals`), the current run saves its report as
  ``terminated``, then the handler that was there before runs, or the signal's default action.

The traceback, exit status and last stderr line are the program's own. The guard knows a run only through the
small interface below (:class:`GuardedRun`); it imports nothing of the engine.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Protocol

from perfhooks.locks import interrupted_inside
from perfhooks.runtime.ending.signals import SignalChain, SignalHelper

#: Seconds perfhooks' exit work may take in total (an uncaught error or interpreter exit).
EXIT_DEADLINE_S = 5.0


class GuardedRun(Protocol):
    """What the guard needs of a run."""

    @property
    def closed(self) -> bool: ...

    #: The run saw the user's error (its report's ``error``), and its framework always ends runs explicitly.
    error: dict[str, Any] | None
    ends_explicitly: bool

    def exception(self, error: BaseException, deadline_s: float | None = None, quiet: bool = False) -> None: ...

    def abandon(self, deadline_s: float | None = None, quiet: bool = False, superseded: bool = False) -> None: ...

    def terminated(self, name: str, busy: bool, helper: Callable[[Callable[[], None], float], bool]) -> None: ...


_lock = threading.Lock()
_current: weakref.ref[Any] | None = None
_installed = False
_previous_hook: Any = None
#: How many runs began in this process (any integration, or ``perfhooks.profile``): the launcher's "nothing was
#: profiled" notice reads it.
_begun = 0


def runs_begun() -> int:
    """How many runs began in this process so far."""
    return _begun


def current() -> Any | None:
    """The run in progress in this process, if any."""
    return _current() if _current is not None else None


def _on_signal(name: str, frame: FrameType | None) -> None:
    """In the handler, on the main thread: no lock taken (``current`` reads a reference)."""
    run = current()
    if run is not None and not run.closed:
        run.terminated(name, interrupted_inside(frame), _helper.run)


#: perfhooks' handlers for the signals that end a run, chained to the handlers they found (:mod:`signals`), and
#: the thread that does their saving (while a run has handlers installed).
_signals = SignalChain(_on_signal)
_helper = SignalHelper()


def begin(run: GuardedRun, signals: tuple[str, ...] = ()) -> None:
    """``run`` is the process's run from now on; a previous one that never ended is abandoned first (the HF
    Trainer's ``auto_find_batch_size`` retry, an OOM the caller caught, a notebook cell re-run). ``signals``: the
    names whose arrival saves its report as terminated (installed from the main thread only)."""
    global _current, _begun
    previous = current()
    _begun += 1
    if previous is not None and previous is not run and not previous.closed:
        previous.abandon(deadline_s=EXIT_DEADLINE_S, quiet=True, superseded=True)  # the new run's start waits no longer
    with _lock:
        _current = weakref.ref(run)
    _install()
    if _signals.install(signals):
        _helper.start()


def end(run: GuardedRun) -> None:
    """``run`` closed: it is no longer the current run, and perfhooks' signal handlers are put back."""
    global _current
    with _lock:
        ended = current() is run
        if ended:
            _current = None
    if ended:
        _signals.remove()
        _helper.stop()


def release_signals(run: GuardedRun, *more: Callable[[], None]) -> None:
    """Put back the signal handlers ``run`` found, while it is the current run, and call ``more`` (the run's own
    handlers' releases). Main thread only; no lock taken."""
    if current() is run:
        _signals.remove()
        for release in more:
            release()


#: The process whose multiprocessing exit handler runs :func:`_at_exit` (a forked child registers its own).
_child_exit_pid: int | None = None


def _install() -> None:
    global _installed, _previous_hook, _child_exit_pid
    with _lock:
        if multiprocessing.parent_process() is not None and _child_exit_pid != os.getpid():
            _child_exit_pid = os.getpid()  # a multiprocessing child exits with os._exit: atexit never runs there
            multiprocessing.util.Finalize(None, _at_exit, exitpriority=100)
        if _installed:
            return
        _installed = True
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook
        atexit.register(_at_exit)


def _after_fork_in_child() -> None:
    """A forked child starts with no current run (the parent's engine, copied, is not the child's), and a lock of
    its own (another thread may have held the parent's at the fork)."""
    global _current, _lock
    _current = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    """The user's traceback first (the hook that was there before), then the run's end."""
    try:
        (_previous_hook or sys.__excepthook__)(kind, error, tb)
    finally:
        run = current()
        if run is not None and not run.closed:
            run.exception(error, deadline_s=EXIT_DEADLINE_S, quiet=True)


def _at_exit() -> None:
    """A run still open at interpreter exit: a loop that never closed its session (``attach`` without ``with``)
    ends here with its table; one that saw an error, or whose framework always ends its runs, ends quietly."""
    run = current()
    if run is not None and not run.closed:
        run.abandon(deadline_s=EXIT_DEADLINE_S, quiet=run.error is not None or run.ends_explicitly)
