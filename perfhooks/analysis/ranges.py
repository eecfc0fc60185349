"""Interval arithmetic on sorted, disjoint lists of (start, end) spans, in µs."""

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


def intersect(a: list[Span], b: list[Span]) -> list[Span]:
    """Intersection of two sorted disjoint span lists."""
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Span], b: list[Span]) -> list[Span]:
    """``a`` minus ``b``, both sorted and disjoint."""
    out: list[Span] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def total(spans: Iterable[Span]) -> float:
    return sum(end - start for start, end in spans)
