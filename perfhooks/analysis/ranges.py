"""Small interval helpers on (start, end) spans in µs; large span sets use :mod:`perfhooks.analysis.spans`."""

from __future__ import annotations

from collections.abc import Iterable

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
