"""Wrapping a framework object's methods, and putting back exactly what was there: instance patches, the
launcher's constructor wrapping, and the wrappers that time an aside or note an error passing through.

What perfhooks puts on a user's object travels with it nowhere and keeps it alive never:

- a patch (:class:`Patched`) pickles and deep-copies as what the instance held before (its class's method, bound
  to the copy, or the user's own value), so a copy carries no perfhooks state and no reference to the run;
- the original method a wrapper calls is bound at each call to its owner held weakly (:class:`WeakBound`), so the
  owner's ``__dict__`` holds no cycle back to the owner: deleting the last reference frees it at once, as plain.
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
import weakref
from collections.abc import Callable
from typing import Any

from perfhooks.faults import FaultLog
from perfhooks.timebase import monotonic_ns


class WeakBound:
    """``owner.name`` as the class defines it, bound at each call to ``owner``, which it holds weakly: a wrapper
    that calls it keeps no reference to the owner. A plain function (the common case) is called with the owner as
    its first argument, with no bound method made."""

    __slots__ = ("__weakref__", "bind", "function", "owner")

    def __init__(self, owner: Any, descriptor: Any) -> None:
        self.owner = weakref.ref(owner)
        plain = isinstance(descriptor, types.FunctionType)
        self.function = descriptor if plain else None
        self.bind = None if plain else getattr(descriptor, "__get__", lambda *_: descriptor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self.owner()
        if owner is None:
            raise ReferenceError("the object this method belongs to was garbage-collected")
        if self.function is not None:
            return self.function(owner, *args, **kwargs)
        return self.bind(owner, type(owner))(*args, **kwargs)  # type: ignore[misc]


class Patched(functools.partial):  # type: ignore[type-arg]
    """What a patch puts in an instance's ``__dict__``: ``call`` (as a ``functools.partial``, called with no frame
    of its own), and on the way out (pickle, deepcopy) what the instance held before: the user's own value, or the
    class's method bound to the copy."""

    def __new__(cls, call: Callable[..., Any], owner: Any, name: str, before: Any) -> Patched:
        patched = super().__new__(cls, call)
        patched.__dict__.update(owner=_weak(owner), name=name, before=before)
        return patched

    def __reduce__(self) -> tuple[Any, ...]:  # type: ignore[override]
        if self.before is not _ABSENT:
            return operator.itemgetter(0), ((self.before,),)  # the user's own value, as it was
        owner = self.owner()
        if owner is None:
            raise TypeError(f"cannot pickle a perfhooks patch of {self.name!r} whose object is gone")
        return getattr, (owner, self.name)  # the class's method, bound to the copy

    def __getattr__(self, name: str) -> Any:  # __name__, __doc__, __wrapped__ ... as the method's
        before = self.__dict__.get("before", _ABSENT)
        if before is _ABSENT:
            owner = self.__dict__["owner"]()
            before = getattr(type(owner), self.__dict__["name"], None) if owner is not None else None
        return getattr(before, name)


class InstancePatches:
    """Methods replaced on one object (its ``__dict__``), for the length of a run; ``restore()`` is idempotent.

    The class and every other instance are left alone, and an override in a user's subclass is what
    gets wrapped. The objects are held weakly: a patch never keeps its owner alive.
    """

    def __init__(self) -> None:
        self._patched: list[tuple[Callable[[], Any], str, Any, Callable[[], Any]]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Put ``value`` in ``owner.__dict__[name]`` (as a :class:`Patched`, which pickles as what was there),
        remembering what the instance held there (a user's own patch or ``Mock`` included) or that it held
        nothing."""
        before = owner.__dict__.get(name, _ABSENT)
        patched = Patched(value, owner, name, before)
        owner.__dict__[name] = patched
        self._patched.append((_weak(owner), name, before, _weak(patched)))

    @staticmethod
    def original(owner: Any, name: str) -> Callable[..., Any]:
        """What ``owner.name`` calls now, for a wrapper to call: the instance's own value where it has one (a
        user's patch), else the class's method bound at each call to ``owner`` held weakly (:class:`WeakBound`)."""
        own = owner.__dict__.get(name, _ABSENT)
        if own is not _ABSENT:
            return own  # type: ignore[no-any-return]
        try:
            weakref.ref(owner)
        except TypeError:
            return getattr(owner, name)  # type: ignore[no-any-return]
        return WeakBound(owner, inspect.getattr_static(type(owner), name))

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
