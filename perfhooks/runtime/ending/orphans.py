"""A run whose owner is gone closes itself: no handler, thread, hook or attribute of perfhooks outlives it.

A run ends at its framework's end hook, or through the exit guard. Some runs get neither: an HF ``Trainer``
subclass whose ``train()`` does not call ``super().train()`` raises, the caller catches the error, and the Trainer
is dropped. Such a run would keep its signal handlers (a later Ctrl-C in unrelated code would rewrite its report),
its watch thread, and its hooks. So the run is taken as left open, and closed as ``failed`` on the watch thread,
when:

- its owner (the Trainer) was collected: a ``weakref.finalize`` sets a flag and, on the main thread, puts back
  the signal handlers the run found (``signal.signal`` takes no lock); nothing more, since a finalizer runs
  wherever the collector does, perhaps inside a lock;
- or it saw the user's error and no step came for :data:`AFTER_ERROR_LIMITS` stall limits;
- or the user removed its output folder and no step came for a stall limit.

A terminating handler left installed because the close ran off the main thread (only the main thread may change
handlers) puts the found handler back the next time it runs, and passes the signal on.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

#: Stall limits without a step, after the user's error, before the run is taken as left open.
AFTER_ERROR_LIMITS = 3.0


class OwnerWatch:
    """Whether the object that drives a run is gone, and why the run is taken as left open."""

    def __init__(self, release_signals: Callable[[], None]) -> None:
        #: What is gone (``the Trainer was garbage-collected``), set by the owner's finalizer.
        self.gone: str | None = None
        #: Puts back the signal handlers the run found (main thread only; no lock).
        self.release_signals = release_signals
        self._owner: Callable[[], Any] = lambda: None
        self._step_of: Callable[[Any], Any] | None = None

    def follow(self, owner: Any, name: str, step_of: Callable[[Any], Any] | None = None) -> None:
        """Note when ``owner`` (called ``name`` in the report) is collected; nothing where it takes no weakref.
        ``step_of(owner)``: the framework's own step counter (Lightning's ``trainer.global_step``)."""
        try:
            weakref.finalize(owner, _collected, weakref.ref(self), name)
            self._owner, self._step_of = weakref.ref(owner), step_of
        except TypeError:
            return

    def step(self, default: int) -> int:
        """The framework's own step counter now, read from the owner (attribute reads: no lock, any thread), or
        ``default`` where none is known. The framework's counter moves before perfhooks hears of the step (at its
        next callback), so a signal or an error between the two is placed at the framework's step."""
        owner = self._owner()
        if owner is None or self._step_of is None:
            return default
        try:
            step = self._step_of(owner)
        except Exception:  # a framework property that fails: perfhooks' count stands
            return default
        return step if isinstance(step, int) and not isinstance(step, bool) else default

    def left_open(self, idle_s: float, limit_s: float, error_seen: bool, output_removed: bool) -> str | None:
        """Why the run is taken as left open after ``idle_s`` seconds without a step (``limit_s``: the stall
        limit), or None while it is not."""
        if self.gone is not None:
            return self.gone
        if error_seen and idle_s > AFTER_ERROR_LIMITS * limit_s:
            return f"no step came for {idle_s:.0f} s after the error"
        if output_removed and idle_s > limit_s:
            return f"its output folder was removed and no step came for {idle_s:.0f} s"
        return None


def _collected(watch: weakref.ref[OwnerWatch], name: str) -> None:
    """The owner's finalizer: one assignment (it may run inside any code, on any thread)."""
    owner_watch = watch()
    if owner_watch is not None and owner_watch.gone is None:
        owner_watch.gone = f"the {name} running it was garbage-collected"
        if threading.current_thread() is threading.main_thread():
            owner_watch.release_signals()
