"""perfhooks' own lock-holding code, marked, so that a signal's handler knows whether it interrupted it.

A Python signal handler runs on the main thread, between two bytecodes of whatever that thread was running. If
that was perfhooks' code holding a lock (the writer queue's mutex in ``submit``, the fault log's, a window record's,
the capture watch's), whatever the handler then does that takes the same lock waits for ever: the thread that
would release it is the one the handler runs on. So:

- each function of perfhooks that holds a lock, or stops a capture window, is marked with :func:`holds_lock`,
  which records its code object and returns the function unchanged (nothing is added to a call);
- :func:`interrupted_inside` walks the interrupted thread's frames and says whether one of them is marked. It
  takes no lock: a set read and attribute reads;
- :class:`bounded` is for readers that only copy (a report built off the training thread): it holds the lock if it
  frees within ``wait_s`` seconds, else goes on without it (each copy of a list or dict is atomic under the GIL).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: The code objects of perfhooks' lock-holding functions (filled at import, only read after).
_MARKED: set[CodeType] = set()
#: Seconds a copying reader waits for a lock before it copies without it.
READ_WAIT_S = 0.05


def holds_lock(function: F) -> F:
    """Mark ``function`` as holding a lock of perfhooks' (or stopping a capture window); it is returned as is."""
    code = getattr(function, "__code__", None)
    if code is not None:
        _MARKED.add(code)
    return function


def interrupted_inside(frame: FrameType | None) -> bool:
    """Whether ``frame`` (a signal handler's interrupted frame) or one of its callers is a marked function.
    No frame (a handler called by hand) counts as inside: then nothing that takes a lock is done."""
    if frame is None:
        return True
    marked = _MARKED
    while frame is not None:
        if frame.f_code in marked:
            return True
        frame = frame.f_back
    return False


class bounded:
    """``with bounded(lock):`` holds ``lock`` when it frees within :data:`READ_WAIT_S`, else runs without it."""

    __slots__ = ("_held", "_lock")

    def __init__(self, lock: threading.Lock | threading.RLock) -> None:
        self._lock = lock
        self._held = False

    def __enter__(self) -> bool:
        self._held = self._lock.acquire(timeout=READ_WAIT_S)
        return self._held

    def __exit__(self, *exc: object) -> None:
        if self._held:
            self._lock.release()
