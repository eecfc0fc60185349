"""Interval arithmetic: small lists of ``(start, end)`` spans (µs), and, vectorized (numpy), the large span sets of a
trace.

A span set is a pair of float arrays ``(starts, ends)`` in µs. ``union`` returns it sorted and
disjoint; measures clip to a few windows (the steps). The precedence breakdown uses
``|A ∪ B| - |A|``: the time a role adds on top of the roles before it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

Span = tuple[float, float]


def merge(spans: Iterable[Span]) -> list[Span]:
    """Union of possibly overlapping spans, sorted and disjoint."""
    merged: list[Span] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total(spans: Iterable[Span]) -> float:
    return sum(end - start for start, end in spans)


def subtract(windows: list[Span], holes: list[Span]) -> list[Span]:
    """The parts of ``windows`` (sorted, disjoint) outside ``holes`` (sorted, disjoint)."""
    out: list[Span] = []
    h = 0
    for start, end in windows:
        while h < len(holes) and holes[h][1] <= start:
            h += 1
        k = h
        cursor = start
        while k < len(holes) and holes[k][0] < end:
            if holes[k][0] > cursor:
                out.append((cursor, holes[k][0]))
            cursor = max(cursor, holes[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


Spans = tuple[np.ndarray, np.ndarray]
EMPTY: Spans = (np.empty(0), np.empty(0))


def of_events(events: list[Any]) -> Spans:
    if not events:
        return EMPTY
    starts = np.fromiter((e.ts for e in events), dtype=np.float64, count=len(events))
    durations = np.fromiter((e.dur for e in events), dtype=np.float64, count=len(events))
    return starts, starts + durations


def concat(*sets: Spans) -> Spans:
    return np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets])


def union(spans: Spans) -> Spans:
    """Sorted, disjoint union."""
    starts, ends = spans
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    breaks = np.flatnonzero(starts[1:] > ends[:-1])
    first = np.concatenate(([0], breaks + 1))
    last = np.concatenate((breaks, [starts.size - 1]))
    return starts[first], ends[last]


def measure(spans: Spans, windows: list[tuple[float, float]]) -> float:
    """Total length of a sorted, disjoint span set (what :func:`union` returns) inside the (disjoint) windows.
    Each window reads only the spans that reach into it (found by bisection: the set's ends are sorted too), so a
    trace of many steps costs the spans once, not once a step."""
    starts, ends = spans
    if starts.size == 0:
        return 0.0
    total = 0.0
    for low, high in windows:
        first = int(np.searchsorted(ends, low, side="right"))
        last = int(np.searchsorted(starts, high, side="left"))
        if last > first:
            clipped = np.minimum(ends[first:last], high) - np.maximum(starts[first:last], low)
            total += float(clipped[clipped > 0].sum())
    return total
