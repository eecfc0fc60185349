"""Wrapping a framework object's methods, and putting back exactly what was there: instance patches, the
launcher's constructor wrapping, and the wrappers that time an aside or note an error passing through.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from perfhooks.faults import FaultLog
from perfhooks.timebase import monotonic_ns


class InstancePatches:
    """Methods replaced on one object (its ``__dict__``), for the length of a run; ``restore()`` is idempotent.

    The class and every other instance are left alone, and an override in a user's subclass is what
    gets wrapped. The objects are held weakly: a patch never keeps its owner alive.
    """

    def __init__(self) -> None:
        self._patched: list[tuple[Callable[[], Any], str, Any, Callable[[], Any]]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Put ``value`` in ``owner.__dict__[name]``, remembering what the instance held there (a user's own
        patch or ``Mock`` included) or that it held nothing."""
        before = owner.__dict__.get(name, _ABSENT)
        owner.__dict__[name] = value
        self._patched.append((_weak(owner), name, before, _weak(value)))

    def restore(self) -> None:
        """Put back what each instance held before, newest patch first. An attribute the user replaced during
        the run is the user's and stays."""
        patched, self._patched = self._patched, []
        for reference, name, before, value in reversed(patched):
            owner, ours = reference(), value()
            # gone with its owner, or replaced by the user: not ours to put back
            if owner is None or ours is None or owner.__dict__.get(name, _ABSENT) is not ours:
                continue
            if before is _ABSENT:
                del owner.__dict__[name]
            else:
                owner.__dict__[name] = before


_ABSENT = object()


def _weak(owner: Any) -> Callable[[], Any]:
    """A reference to a patched object that does not keep it alive (a Trainer the caller dropped is collected,
    and its run with it: :mod:`perfhooks.runtime.ending.orphans`), where one can be made."""
    try:
        return weakref.ref(owner)
    except TypeError:
        return lambda: owner


def wrap_construction(cls: type, before: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                      after: Callable[[Any], None] | None = None) -> Callable[[], None]:
    """Replace ``cls.__init__`` (for ``perfhooks run``): ``before(kwargs)`` returns the keyword arguments to
    build with, ``after(instance)`` runs on the built object. A fault in either is reported once and the object
    is built as the user asked. Returns the undo, which puts the original ``__init__`` back."""

    original = cls.__init__
    faults = FaultLog()

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if before is not None:
            try:
                kwargs = before(dict(kwargs))
            except Exception as error:  # never into the user's script
                faults.report("perfhooks run", error)
        original(self, *args, **kwargs)
        if after is not None:
            try:
                after(self)
            except Exception as error:
                faults.report("perfhooks run", error)

    cls.__init__ = __init__  # type: ignore[misc]

    def undo() -> None:
        cls.__init__ = original  # type: ignore[misc]

    return undo


def timed_aside(engine: Any, kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run as an aside of ``kind`` (``evaluation``, ``checkpoint``); its errors noted and re-raised."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        with engine.aside(kind):
            return method(*args, **kwargs)

    return noting_errors(engine, timed)


def named_work(engine: Any, name: str, method: Callable[..., Any], ends: str | None = None) -> Callable[..., Any]:
    """``method`` timed as named host work of the open step (its own line of the step's ``other``); it first ends
    phase ``ends`` when that is the open one (a collective inside a fetch is not data wait)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        if ends is not None:
            engine.phase_end(ends)
        start = monotonic_ns()
        try:
            return method(*args, **kwargs)
        finally:
            engine.named(name, (monotonic_ns() - start) / 1e6)

    return noting_errors(engine, timed)


def noting_errors(engine: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, with an error that passes through it noted by the engine (the caller may still catch it)."""

    def noted(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except BaseException as error:
            engine.note_error(error)
            raise

    return noted
