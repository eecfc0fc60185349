"""Step records: the clock marks of each optimizer step, held until the device has finished them, then resolved
into :class:`~perfhooks.report.statistics.StepTiming` (no host sync: marks are polled, never waited on per step).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from perfhooks.device.clock import HostClock
from perfhooks.events import ASIDES, HOST_TIMED_PHASES, OTHER
from perfhooks.report.statistics import PhaseStatistics, StepTiming


@dataclass(slots=True)
class StepRecord:
    """The marks of one optimizer step, before they are turned into milliseconds."""

    step: int
    start: Any  # a clock mark: an int on the host, a clock.Mark on CUDA
    end: Any = None
    #: ``(name, start, end)`` of each phase, and of each evaluation/checkpoint the step contained.
    intervals: list[tuple[str, Any, Any]] = field(default_factory=list)
    micro_batches: int = 0
    #: An optimizer stepped during this record: it is a training step (ends at the next fetch).
    stepped: bool = False
    #: The framework's own step counter when the optimizer stepped.
    global_step: int | None = None
    #: perfhooks' own work (a capture window, trace export, window analysis, memory capture) overlapped it.
    own: bool = False


class PendingSteps:
    """Steps whose marks may still be in flight on the device; resolved in order, without blocking."""

    def __init__(self, clock: HostClock, limit: int = 512) -> None:
        self.clock = clock
        self.limit = limit
        self.dropped = 0
        self._queue: deque[StepRecord] = deque()

    def push(self, record: StepRecord) -> None:
        self._queue.append(record)
        if len(self._queue) > self.limit:
            self.discard(self._queue.popleft())
            self.dropped += 1

    def __len__(self) -> int:
        return len(self._queue)

    def drain(self, stats: PhaseStatistics, block: bool = False) -> None:
        """Move every ready step into ``stats``; with ``block`` (flush time only), wait for all."""
        while self._queue:
            record = self._queue[0]
            assert record.end is not None
            if block:
                self.clock.wait(record.end)
            elif not self.clock.ready(record.end):
                return
            self._queue.popleft()
            stats.add(self._resolve(record))
            self.discard(record)

    def _resolve(self, record: StepRecord) -> StepTiming:
        clock = self.clock
        assert record.end is not None
        elapsed, host_ms = clock.elapsed_ms, clock.host_ms
        step_ms = elapsed(record.start, record.end)
        phase_ms: dict[str, float] = {}
        covered = aside_ms = 0.0
        for name, start, end in record.intervals:
            if name in ASIDES:
                aside_ms += max(0.0, elapsed(start, end))
                continue
            ms = host_ms(start, end) if name in HOST_TIMED_PHASES else elapsed(start, end)
            if ms > 0.0:
                phase_ms[name] = phase_ms.get(name, 0.0) + ms
                covered += ms
        step_ms = max(0.0, step_ms - aside_ms)
        phase_ms[OTHER] = max(0.0, step_ms - covered)
        return StepTiming(record.step, step_ms, phase_ms, record.micro_batches, record.global_step, record.own,
                          aside_ms)

    def discard(self, record: StepRecord) -> None:
        """Return a step's CUDA events to the pool (host marks hold nothing)."""
        if not self.clock.device_timed:
            return
        self.clock.release(record.start)
        for _, start, end in record.intervals:
            self.clock.release(start)
            self.clock.release(end)
        if record.end is not None:
            self.clock.release(record.end)
