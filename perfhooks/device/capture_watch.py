"""Whether a CUDA graph capture may be under way, known without asking the device before every call.

A query, a synchronize or ``cudaMemGetInfo`` while a stream captures invalidates the user's graph, and an event
recorded into a capture never completes. Asking the stream (``cudaStreamIsCapturing``) before each of a step's
calls cost 18 calls a step on an H100. Instead, perfhooks follows torch's graph-capture entry point,
``torch.cuda.graph`` (what ``make_graphed_callables``, Inductor's CUDA graph trees and users' own captures go
through): while one is open anywhere in the process, :func:`active` is true and the room asks the stream before
each call, as before; otherwise it makes none. A capture begun another way (``CUDAGraph.capture_begin`` called
directly) is caught by the one check a step makes when it opens (:meth:`DeviceClock.step_opening
<perfhooks.device.clock.DeviceClock.step_opening>`).

The two methods of ``torch.cuda.graphs.graph`` are wrapped while at least one run follows captures, and put
back when the last one lets go, if they are still perfhooks' wrappers. The wrappers only count; the capture is
torch's own.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from perfhooks.locks import holds_lock

#: Taken only to follow or let go and at a capture's edges, never on a step's path. Reentrant: a terminating
#: signal's close (``let_go``) may run on the thread that the signal interrupted inside ``_count``.
_lock = threading.RLock()
_followers = 0
#: ``torch.cuda.graph`` contexts entered and not yet left, in the process (read as
#: ``capture_watch.open_contexts`` on a step's path: an attribute, not a call).
open_contexts = 0
_saved: tuple[Any, Any, Any] | None = None  # (the class, its __enter__, its __exit__)


def active() -> bool:
    """A capture may be under way somewhere in the process (a ``torch.cuda.graph`` context is open)."""
    return open_contexts > 0


@holds_lock
def follow(torch: Any) -> bool:
    """Start following ``torch.cuda.graph`` (once per process, counted); False where torch has no such class."""
    global _followers, _saved, open_contexts
    graph = getattr(getattr(getattr(torch, "cuda", None), "graphs", None), "graph", None)
    if not isinstance(graph, type) or not callable(getattr(graph, "__enter__", None)):
        return False
    with _lock:
        _followers += 1
        if _saved is None:
            enter, leave = graph.__dict__.get("__enter__"), graph.__dict__.get("__exit__")
            if enter is None or leave is None:
                _followers -= 1
                return False
            _saved = (graph, enter, leave)
            open_contexts = 0
            graph.__enter__ = _entering(enter)
            graph.__exit__ = _leaving(leave)
    return True


@holds_lock
def let_go() -> None:
    """One follower fewer; the last puts ``torch.cuda.graph``'s methods back (if they are still perfhooks')."""
    global _followers, _saved
    with _lock:
        if _followers == 0:
            return
        _followers -= 1
        if _followers or _saved is None:
            return
        graph, enter, leave = _saved
        _saved = None
        if getattr(graph.__dict__.get("__enter__"), "__wrapped__", None) is enter:
            graph.__enter__ = enter
        if getattr(graph.__dict__.get("__exit__"), "__wrapped__", None) is leave:
            graph.__exit__ = leave


@holds_lock
def _count(delta: int) -> None:
    global open_contexts
    with _lock:
        open_contexts = max(0, open_contexts + delta)


def _entering(enter: Any) -> Any:
    @functools.wraps(enter)
    def __enter__(self: Any) -> Any:
        _count(+1)  # before the capture begins: a mark taken from here on asks the stream first
        try:
            return enter(self)
        except BaseException:
            _count(-1)
            raise

    return __enter__


def _leaving(leave: Any) -> Any:
    @functools.wraps(leave)
    def __exit__(self: Any, *args: Any) -> Any:
        try:
            return leave(self, *args)
        finally:
            _count(-1)  # after the capture ended

    return __exit__
