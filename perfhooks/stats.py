"""Streaming statistics in bounded memory: exact count, mean and max; quantiles within 1%.

Values land in logarithmic buckets (each 2% wide), so memory grows with the spread of the
values, never with the number of steps, and two histograms merge by adding bucket counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_RATIO = 1.02
_INV_LOG_RATIO = 1.0 / math.log(_RATIO)
#: Values at or below this (ms) share the zero bucket.
_FLOOR_MS = 1e-6
_INV_FLOOR_MS = 1.0 / _FLOOR_MS
_log = math.log


@dataclass
class StreamingStats:
    """Summary of a stream of non-negative durations in milliseconds."""

    count: int = 0
    total: float = 0.0
    maximum: float = 0.0
    minimum: float = math.inf
    _buckets: dict[int, int] = field(default_factory=dict, repr=False)

    def add(self, value_ms: float) -> None:
        """Add one value (ms); negative values count as 0. Runs once per phase per step: keep it lean."""
        if value_ms <= _FLOOR_MS:
            value_ms = max(0.0, float(value_ms))
            key = -1
        else:
            key = int(_log(value_ms * _INV_FLOOR_MS) * _INV_LOG_RATIO)  # > 0, so int() is floor()
        self.count += 1
        self.total += value_ms
        if value_ms > self.maximum:
            self.maximum = value_ms
        if value_ms < self.minimum:
            self.minimum = value_ms
        buckets = self._buckets
        buckets[key] = buckets.get(key, 0) + 1

    def add_many(self, values_ms: list[float]) -> None:
        """Add a batch of values (ms): the same result as ``add`` on each, in one tight loop."""
        buckets = self._buckets
        total, maximum, minimum = self.total, self.maximum, self.minimum
        for value in values_ms:
            if value <= _FLOOR_MS:
                value = max(0.0, float(value))
                key = -1
            else:
                key = int(_log(value * _INV_FLOOR_MS) * _INV_LOG_RATIO)
            total += value
            if value > maximum:
                maximum = value
            if value < minimum:
                minimum = value
            buckets[key] = buckets.get(key, 0) + 1
        self.count += len(values_ms)
        self.total, self.maximum, self.minimum = total, maximum, minimum

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
