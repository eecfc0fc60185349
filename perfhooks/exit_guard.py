"""One run at a time per process, and a safety net at exit: every engine is closed exactly once.

- :func:`begin` makes an engine the process's current run. A previous engine still open is a run
  that ended without its end event (the HF Trainer's ``auto_find_batch_size`` retry, an OOM the
  caller caught, a notebook cell re-run): it is closed first, as ``failed`` with the error it noted,
  so its profiler session, hooks and threads are gone before the new run starts.
- An uncaught exception: the previous ``sys.excepthook`` prints the user's traceback *first*;
  then the current engine records the error and closes within :data:`EXIT_DEADLINE_S`.
- At interpreter exit, an engine still open is closed within the same deadline.

Nothing here changes what the user sees: the traceback, the exit status and the last stderr line
are the ones the program gives without perfhooks.
"""

from __future__ import annotations

import atexit
import sys
import threading
import weakref
from types import TracebackType
from typing import Any

#: Seconds perfhooks' exit work may take in total (an uncaught error or interpreter exit).
EXIT_DEADLINE_S = 5.0

_lock = threading.Lock()
_current: weakref.ref[Any] | None = None
_installed = False
_previous_hook: Any = None


def current() -> Any | None:
    """The engine of the run in progress in this process, if any."""
    return _current() if _current is not None else None


def begin(engine: Any) -> None:
    """``engine`` is the process's run from now on; close a previous one that never ended."""
    global _current
    previous = current()
    if previous is not None and previous is not engine and not previous.closed:
        previous.abandon(quiet=True)
    with _lock:
        _current = weakref.ref(engine)
    _install()


def end(engine: Any) -> None:
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
            engine.exception(error, deadline_s=EXIT_DEADLINE_S, quiet=True)


def _at_exit() -> None:
    engine = current()
    if engine is not None and not engine.closed:
        engine.abandon(deadline_s=EXIT_DEADLINE_S, quiet=True)
