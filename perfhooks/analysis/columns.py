"""A trace's event lists as columns: one numpy array per field, built once per list and shared by the analyzers.

An analyzer that asks "which launches fall in this step", "how much kernel time per name" or "which kernels are
collectives" answers it with sorting, ``searchsorted``, masks and ``bincount`` over these arrays instead of a
Python pass over event objects. Row ``i`` of every array is ``events[i]``; an event's raw fields (its shapes,
types, stack) stay on the event, decoded only where read. Times are µs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

import numpy as np

#: The value of an integer column where the event has none (no correlation, no external id, no integer device).
ABSENT = -(2**62)

_TS, _DUR, _NAME, _CAT, _PID, _TID = (attrgetter(name) for name in ("ts", "dur", "name", "cat", "pid", "tid"))
#: Numeric arguments read as float columns (:meth:`Columns.argument`).
_FLOAT_ARGUMENTS = {name: attrgetter(f"args.{name}") for name in ("blocks_per_sm", "occupancy", "bytes")}
_CORRELATION, _EXTERNAL_ID_NEW, _EXTERNAL_ID_OLD, _DEVICE = (
    attrgetter(f"args.{name}") for name in ("correlation", "external_id_new", "external_id_old", "device"))


def distinct_codes(values: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """Each value's index in the list of distinct values (in first-seen order), and that list."""
    distinct = list(dict.fromkeys(values))
    index = {value: code for code, value in enumerate(distinct)}
    return np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values)), distinct


def _ints(values: Iterable[Any], count: int) -> np.ndarray:
    """The integers among ``values``, :data:`ABSENT` for anything else."""
    return np.fromiter((value if type(value) is int and -ABSENT > value > ABSENT else ABSENT for value in values),
                       dtype=np.int64, count=count)


class Columns:
    """One event list as arrays, each read from the events the first time it is asked for; ``events[i]`` is row
    ``i``. Fields: ``ts``, ``dur``, ``end`` (``ts + dur``), ``correlation``, ``external_id`` and ``device``
    (``args.device``, else the pid; :data:`ABSENT` where not an integer), and the codes ``name``, ``category`` and
    ``thread`` (``(pid, tid)``) and ``tid`` into the tables ``names``, ``categories``, ``threads`` and ``tids``."""

    def __init__(self, events: list[Any], **known: Any) -> None:
        """``known``: fields already read (arrays; ``(codes, table)`` for a coded one), kept as given."""
        self.events = events
        self._fields: dict[str, Any] = known

    def __len__(self) -> int:
        return len(self.events)

    def _get(self, field: str) -> Any:
        found = self._fields.get(field)
        if found is None:
            found = self._fields[field] = self._read(field)
        return found

    def _read(self, field: str) -> Any:
        """``field``'s array, or ``(codes, table)`` for a coded field, from the events."""
        events, count = self.events, len(self.events)
        if field in ("ts", "dur"):
            return np.fromiter(map(_TS if field == "ts" else _DUR, events), dtype=np.float64, count=count)
        if field == "end":
            return self.ts + self.dur
        if field in ("name", "category", "pid", "tid"):
            return distinct_codes(list(map({"name": _NAME, "category": _CAT, "pid": _PID, "tid": _TID}[field], events)))
        if field == "thread":
            pid, pids = self._get("pid")
            tid, tids = self._get("tid")
            width = max(len(tids), 1)
            pairs, codes = np.unique(pid.astype(np.int64) * width + tid, return_inverse=True)
            return codes.astype(np.int32), [(pids[pair // width], tids[pair % width]) for pair in pairs.tolist()]
        if field == "device":
            device = self._args_ints(_DEVICE, lambda a: a.device)
            if (device == ABSENT).any():
                pid, pids = self._get("pid")
                device = np.where(device != ABSENT, device, _ints(pids, len(pids))[pid])
            return device
        if field == "correlation":
            return self._args_ints(_CORRELATION, lambda a: a.correlation)
        if field in _FLOAT_ARGUMENTS:
            return self._args_floats(field)
        if field == "external_id":
            new = self._args_ints(_EXTERNAL_ID_NEW, lambda a: a.external_id_new)
            if (new == ABSENT).any():
                new = np.where(new != ABSENT, new, self._args_ints(_EXTERNAL_ID_OLD, lambda a: a.external_id_old))
            return new
        raise KeyError(field)

    def _args_ints(self, getter: Callable[[Any], Any], slow: Callable[[Any], Any]) -> np.ndarray:
        """An integer argument of every event: read in C where every event has its arguments and the field is an
        integer or absent; else event by event, :data:`ABSENT` for what is not an integer."""
        events, count = self.events, len(self.events)
        try:
            return np.fromiter(map(getter, events), dtype=np.int64, count=count)
        except (AttributeError, TypeError, ValueError, OverflowError):
            return _ints((None if event.args is None else slow(event.args) for event in events), count)

    def _args_floats(self, field: str) -> np.ndarray:
        """A numeric argument of every event as floats, NaN where absent or not a number."""
        events = self.events
        try:
            return np.array(list(map(_FLOAT_ARGUMENTS[field], events)), dtype=np.float64)
        except (AttributeError, TypeError, ValueError):
            values = (getattr(event.args, field, None) if event.args is not None else None for event in events)
            return np.fromiter((v if type(v) in (int, float) else np.nan for v in values), dtype=np.float64,
                               count=len(events))

    def argument(self, field: str) -> np.ndarray:
        """A numeric argument (``blocks_per_sm``, ``occupancy``, ``bytes``) as floats, NaN where it has none."""
        return self._get(field)

    ts = property(lambda self: self._get("ts"))
    dur = property(lambda self: self._get("dur"))
    end = property(lambda self: self._get("end"))
    correlation = property(lambda self: self._get("correlation"))
    external_id = property(lambda self: self._get("external_id"))
    device = property(lambda self: self._get("device"))
    name = property(lambda self: self._get("name")[0])
    names = property(lambda self: self._get("name")[1])
    category = property(lambda self: self._get("category")[0])
    categories = property(lambda self: self._get("category")[1])
    tid = property(lambda self: self._get("tid")[0])
    tids = property(lambda self: self._get("tid")[1])
    thread = property(lambda self: self._get("thread")[0])
    threads = property(lambda self: self._get("thread")[1])

    def name_mask(self, test: Callable[[Any], bool]) -> np.ndarray:
        """Rows whose name passes ``test`` (called once per distinct name)."""
        return self.code_mask(self.name, [bool(test(name)) for name in self.names])

    def named(self, wanted: Iterable[Any]) -> np.ndarray:
        """Rows whose name is one of ``wanted``."""
        wanted = set(wanted)
        return self.code_mask(self.name, [name in wanted for name in self.names])

    @staticmethod
    def code_mask(codes: np.ndarray, passing: list[bool]) -> np.ndarray:
        if not passing:
            return np.zeros(codes.size, dtype=bool)
        return np.asarray(passing, dtype=bool)[codes]

    def take(self, rows: np.ndarray) -> list[Any]:
        """The events at ``rows`` (indices or a mask), in row order."""
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        events = self.events
        return [events[i] for i in rows.tolist()]

    def subset(self, rows: np.ndarray) -> Columns:
        """The rows ``rows`` (indices): their events, and each field as this one's rows when asked for."""
        return _Rows(self, rows)

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        """The rows of ``parts`` one after the other."""
        return _Joined(parts)

    def sorted_by_start(self) -> Columns:
        """The rows in start order (stable: equal starts keep their order)."""
        return self.subset(np.argsort(self.ts, kind="stable"))


class _Rows(Columns):
    def __init__(self, parent: Columns, rows: np.ndarray) -> None:
        super().__init__(parent.take(rows))
        self._parent, self._rows = parent, rows

    def _read(self, field: str) -> Any:
        found = self._parent._get(field)
        if isinstance(found, tuple):
            return found[0][self._rows], found[1]
        return found[self._rows]


class _Joined(Columns):
    def __init__(self, parts: list[Columns]) -> None:
        super().__init__([event for part in parts for event in part.events])
        self._parts = parts

    def _read(self, field: str) -> Any:
        found = [part._get(field) for part in self._parts]
        if not found:
            return super()._read(field)
        if not isinstance(found[0], tuple):
            return np.concatenate(found)
        table: dict[Any, int] = {}
        codes = []
        for part_codes, part_table in found:
            recode = np.fromiter((table.setdefault(v, len(table)) for v in part_table), dtype=np.int32,
                                 count=len(part_table))
            codes.append(recode[part_codes] if len(part_table) else part_codes)
        return np.concatenate(codes), list(table)
