"""The batch as the DataLoader hands it over, on the host, before a framework moves it to the device.

The HF Trainer, Lightning and accelerate move each batch to the device before perfhooks' hooks see it. On a GPU,
summing its ``attention_mask`` there is a device op whose value the host would wait for, so the padding in the
batches was unseen. The DataLoader's own iterator (``torch.utils.data.dataloader._BaseDataLoaderIter.__next__``,
what every one of them iterates, in the training process even with worker processes) returns the collated batch
on the host: a wrapper around it hands that batch to the run's listener, on the training thread, while a run
follows. The wrapper only reads; the batch goes on unchanged. The class's method is put back when the last run
lets go, if it is still perfhooks' wrapper.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from perfhooks.locks import holds_lock

Listener = Callable[[Any], None]

_lock = threading.Lock()
#: The listener of each thread's run (the training thread's), read without the lock on each ``next()``.
_listeners: dict[int, Listener] = {}
_saved: tuple[Any, Any] | None = None  # (the iterator class, its own __next__)
#: The most worker processes a DataLoader iterated on a followed thread used (the settings audit reads it).
_workers = [0]


def most_workers() -> int:
    """The most worker processes of a DataLoader whose batches a run's thread took so far (0: none seen)."""
    return _workers[0]


@holds_lock
def follow(listener: Listener) -> bool:
    """Hand this thread's DataLoader batches to ``listener`` until :func:`let_go`; False where torch has no such
    iterator class."""
    global _saved
    try:
        from torch.utils.data import dataloader
    except ImportError:
        return False
    iterator = getattr(dataloader, "_BaseDataLoaderIter", None)
    original = getattr(iterator, "__dict__", {}).get("__next__")
    with _lock:
        if _saved is None:
            if original is None:
                return False
            _saved = (iterator, original)
            iterator.__next__ = _handing(original)  # type: ignore[union-attr]
        _listeners[threading.get_ident()] = listener
    return True


@holds_lock
def let_go(listener: Listener) -> None:
    """Stop handing batches to ``listener``; the last one puts torch's method back (if still ours)."""
    global _saved
    with _lock:
        for ident, known in list(_listeners.items()):
            if known == listener:
                del _listeners[ident]
        if not _listeners and _saved is not None:
            iterator, original = _saved
            if getattr(iterator.__dict__.get("__next__"), "__wrapped__", None) is original:
                iterator.__next__ = original
            _saved = None


def _handing(original: Any) -> Any:
    get_ident = threading.get_ident
    workers = _workers

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        batch = original(self)
        listener = _listeners.get(get_ident())
        if listener is not None:
            count = getattr(self, "_num_workers", 0)  # torch's iterator's: one read a batch
            if count > workers[0]:
                workers[0] = count
            try:  # noqa: SIM105  (free when nothing is raised; contextlib.suppress is three calls a batch)
                listener(batch)
            except Exception:  # the listener guards itself; the batch is the user's either way
                pass
        return batch

    return __next__
