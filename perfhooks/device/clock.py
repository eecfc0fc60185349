"""Timestamps for phase and step boundaries, on the host or on the CUDA stream.

On the host a mark is the integer ``time.perf_counter_ns()`` (marks are taken ~9 times a
step, so they stay as cheap as that). On CUDA a mark is a :class:`Mark`: the host time plus
an event recorded on the current stream. Intervals between two CUDA marks are read later,
once both events have completed (``Event.query()`` never blocks), so timing a step never
stalls the GPU. Only :meth:`CudaClock.wait` blocks, and the engine calls it at flush time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Mark:
    host_ns: int
    event: Any = None  # torch.cuda.Event on CUDA


class HostClock:
    """Times intervals with ``time.perf_counter_ns``; marks are ints, ready at once."""

    device_timed = False

    def __init__(self) -> None:
        self.mark: Callable[[], Any] = time.perf_counter_ns

    def ready(self, mark: Any) -> bool:
        return True

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Interval on this clock's timeline (ms)."""
        return (end - start) / 1e6

    def host_ms(self, start: Any, end: Any) -> float:
        """Interval on the host clock (ms), whatever the timeline."""
        return (end - start) / 1e6

    def release(self, mark: Any) -> None:
        pass

    def wait(self, mark: Any) -> None:
        pass


class CudaClock(HostClock):
    """Times intervals on the device timeline with CUDA events, recycled through a pool."""

    device_timed = True

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._pool: list[Any] = []
        self.mark = self._record_mark

    def _record_mark(self) -> Mark:
        event = self._pool.pop() if self._pool else self._torch.cuda.Event(enable_timing=True)
        event.record()
        return Mark(time.perf_counter_ns(), event)

    def ready(self, mark: Mark) -> bool:
        return mark.event.query()

    def elapsed_ms(self, start: Mark, end: Mark) -> float:
        return start.event.elapsed_time(end.event)

    def host_ms(self, start: Mark, end: Mark) -> float:
        return (end.host_ns - start.host_ns) / 1e6

    def release(self, mark: Mark) -> None:
        if mark.event is not None and len(self._pool) < 4096:
            self._pool.append(mark.event)
            mark.event = None

    def wait(self, mark: Mark) -> None:
        """Block until ``mark`` has completed on the device (flush time only)."""
        mark.event.synchronize()
