"""Streaming statistics in bounded memory: exact count, mean and max; quantiles within 1%.

Values land in logarithmic buckets (each 2% wide), so memory grows with the spread of the
values, never with the number of steps, and two histograms merge by adding bucket counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_RATIO = 1.02
_LOG_RATIO = math.log(_RATIO)
#: Values at or below this (ms) share the zero bucket.
_FLOOR_MS = 1e-6


@dataclass
class StreamingStats:
    """Summary of a stream of non-negative durations in milliseconds."""

    count: int = 0
    total: float = 0.0
    maximum: float = 0.0
    minimum: float = math.inf
    _buckets: dict[int, int] = field(default_factory=dict, repr=False)

    def add(self, value_ms: float) -> None:
        value_ms = max(0.0, float(value_ms))
        self.count += 1
        self.total += value_ms
        self.maximum = max(self.maximum, value_ms)
        self.minimum = min(self.minimum, value_ms)
        key = -1 if value_ms <= _FLOOR_MS else int(math.floor(math.log(value_ms / _FLOOR_MS) / _LOG_RATIO))
        self._buckets[key] = self._buckets.get(key, 0) + 1

    def merge(self, other: StreamingStats) -> None:
        self.count += other.count
        self.total += other.total
        self.maximum = max(self.maximum, other.maximum)
        self.minimum = min(self.minimum, other.minimum)
        for key, n in other._buckets.items():
            self._buckets[key] = self._buckets.get(key, 0) + n

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1), nearest-rank, within 1% of the exact value."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q}")
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen >= rank:
                if key < 0:
                    return min(self.minimum, _FLOOR_MS)
                # geometric middle of the bucket, clamped to what was observed
                middle = _FLOOR_MS * _RATIO ** (key + 0.5)
                return min(max(middle, self.minimum), self.maximum)
        return self.maximum

    def summary(self, suffix: str = "") -> dict[str, float]:
        """``{count, mean, p50, p95, max}``, with ``suffix`` appended to the value keys (e.g. ``_ms``)."""
        return {
            "count": self.count,
            f"mean{suffix}": round(self.mean, 6),
            f"p50{suffix}": round(self.quantile(0.5), 6),
            f"p95{suffix}": round(self.quantile(0.95), 6),
            f"max{suffix}": round(self.maximum, 6),
        }
