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
