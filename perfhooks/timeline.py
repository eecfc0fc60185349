"""Per-step phase intervals, resolved into statistics once their clock marks are ready."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from perfhooks.clock import HostClock, Mark, host_ms
from perfhooks.phases import HOST_TIMED_PHASES, OTHER, PHASES
from perfhooks.stats import StreamingStats


@dataclass(slots=True)
class StepRecord:
    """The marks of one optimizer step, before they are turned into milliseconds."""

    step: int
    start: Mark
    end: Mark | None = None
    intervals: list[tuple[str, Mark, Mark]] = field(default_factory=list)
    micro_batches: int = 0


@dataclass(slots=True)
class StepTiming:
    """One resolved step: its duration and the time per phase (ms)."""

    step: int
    step_ms: float
    phase_ms: dict[str, float]
    micro_batches: int


class PhaseStatistics:
    """Streaming per-phase and per-step statistics over every resolved step, in bounded memory."""

    def __init__(self, history: int = 2048) -> None:
        self.step = StreamingStats()
        self.phases: dict[str, StreamingStats] = {name: StreamingStats() for name in (*PHASES, OTHER)}
        self.micro_batches = 0
        #: The most recent resolved steps, for time series and live diagnoses.
        self.recent: deque[StepTiming] = deque(maxlen=history)

    def add(self, timing: StepTiming) -> None:
        self.step.add(timing.step_ms)
        for name, stats in self.phases.items():
            stats.add(timing.phase_ms.get(name, 0.0))
        self.micro_batches += timing.micro_batches
        self.recent.append(timing)

    @property
    def steps(self) -> int:
        return self.step.count

    def share(self, name: str) -> float:
        """Fraction 0..1 of all step time spent in phase ``name``."""
        return self.phases[name].total / self.step.total if self.step.total > 0 else 0.0

    @property
    def coverage(self) -> float:
        """Measured phases (``other`` excluded) over step time, 0..1 (may exceed 1 by clock skew on CUDA)."""
        if self.step.total <= 0:
            return 0.0
        return sum(self.phases[name].total for name in PHASES) / self.step.total


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
            self._release(self._queue.popleft())
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
            self._release(record)

    def _resolve(self, record: StepRecord) -> StepTiming:
        clock = self.clock
        assert record.end is not None
        step_ms = clock.elapsed_ms(record.start, record.end)
        phase_ms: dict[str, float] = {}
        for name, start, end in record.intervals:
            measure = host_ms if name in HOST_TIMED_PHASES else clock.elapsed_ms
            phase_ms[name] = phase_ms.get(name, 0.0) + max(0.0, measure(start, end))
        phase_ms[OTHER] = max(0.0, step_ms - sum(phase_ms.values()))
        return StepTiming(record.step, step_ms, phase_ms, record.micro_batches)

    def _release(self, record: StepRecord) -> None:
        self.clock.release(record.start)
        for _, start, end in record.intervals:
            self.clock.release(start)
            self.clock.release(end)
        if record.end is not None:
            self.clock.release(record.end)
