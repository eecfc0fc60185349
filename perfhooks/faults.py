"""Faults inside perfhooks are reported once per kind and never stop training."""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from perfhooks.locks import bounded, holds_lock

log = logging.getLogger("perfhooks")

F = TypeVar("F", bound=Callable[..., Any])


class PerfhooksWarning(UserWarning):
    """Something in perfhooks failed or stepped aside; training goes on."""


def emit(message: str) -> None:
    """One :class:`PerfhooksWarning`, through the ``warnings`` filters, printed as one line: it is attributed to
    ``perfhooks`` (line 0) rather than to a line of code, so Python prints no source line under it."""
    warnings.warn_explicit(message, PerfhooksWarning, filename="perfhooks", lineno=0, module="perfhooks")


class DeviceLost(RuntimeError):
    """The device raised a CUDA error that perfhooks did not cause (a sticky error from the user's kernel, seen
    first by one of perfhooks' calls): perfhooks stops using the device; the user's next call raises it."""


def is_device_error(error: BaseException) -> bool:
    """A CUDA error (not an out-of-memory) after which the context may be unusable: ``torch.AcceleratorError``,
    a ``RuntimeError`` carrying "CUDA error", a cuBLAS or cuDNN status, or :class:`DeviceLost`. By the classes'
    names: no torch import here."""
    if isinstance(error, DeviceLost):
        return True
    names = {cls.__name__ for cls in type(error).__mro__}
    if "OutOfMemoryError" in names:
        return False
    if "AcceleratorError" in names:
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("CUDA error" in text or "CUBLAS_STATUS" in text
                                                or "cuDNN error" in text)


class FaultLog:
    """Counts faults by kind; warns the first time each kind occurs. Any thread may report and read (a lock).

    A device error (:func:`is_device_error`) is not perfhooks' fault: the device failed under the user's work and
    perfhooks' call was only the first to hear of it. It is kept apart (:attr:`device_error`), and nothing is
    printed: the user's own traceback is the one to read."""

    def __init__(self) -> None:
        self._faults: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        #: Entries kept without the lock or a message (:meth:`note`, from a signal's handler).
        self._notes: dict[str, dict[str, Any]] = {}
        #: The first device error a perfhooks call met ("kind: Type: message"), or None.
        self.device_error: str | None = None

    @holds_lock
    def report(self, kind: str, error: BaseException | str) -> None:
        if not isinstance(error, str) and is_device_error(error):
            if self.device_error is None:
                self.device_error = f"{kind}: {type(error).__name__}: {error}"
            return
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        with self._lock:
            entry = self._faults.get(kind)
            first = entry is None
            if entry is None:
                self._faults[kind] = {"kind": kind, "count": 1, "message": message}
            else:
                entry["count"] += 1
        if first:
            emit(f"perfhooks: {kind} failed and was skipped ({message}); training goes on")

    def call(self, kind: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None after reporting its ``Exception`` under ``kind`` (once; training goes on)."""
        try:
            return fn()
        except Exception as error:
            self.report(kind, error)
            return None

    def note(self, kind: str, message: str) -> None:
        """A fault entry kept without taking the lock or printing: a signal's handler's (one assignment)."""
        self._notes[kind] = {"kind": kind, "count": 1, "message": message}

    def as_list(self) -> list[dict[str, Any]]:
        with bounded(self._lock):  # a report built in a signal's saving: the lock's holder may be interrupted
            entries = [dict(entry) for entry in self._faults.values()]
        return entries + [dict(entry) for entry in list(self._notes.values()) if entry["kind"] not in self._faults]


def guarded(kind: str) -> Callable[[F], F]:
    """Run a method of an object with a ``faults: FaultLog``; report an ``Exception`` instead of raising it."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self.faults.call(kind, functools.partial(method, self, *args, **kwargs))

        return wrapper  # type: ignore[return-value]

    return decorate


class Once:
    """Warn about a condition once per instance (not a fault: e.g. a feature stepping aside)."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def warn(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            emit(f"perfhooks: {message}")
