"""Per-step phase intervals, resolved into statistics once their clock marks are ready."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from perfhooks.clock import HostClock
from perfhooks.phases import ASIDES, HOST_TIMED_PHASES, OTHER, PHASES
from perfhooks.stats import StreamingStats


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


@dataclass(slots=True)
class StepTiming:
    """One resolved step: its duration and the time per phase (ms)."""

    step: int
    step_ms: float
    phase_ms: dict[str, float]
    micro_batches: int
    global_step: int | None = None
    own: bool = False
    #: Evaluation/checkpoint time inside the step, taken out of ``step_ms`` (ms).
    aside_ms: float = 0.0


class PhaseStatistics:
    """Streaming per-phase and per-step statistics over every resolved step, in bounded memory.

    Steps are folded into the histograms in batches of ``fold_every`` (one tight loop per
    series instead of six method calls per step); every read folds what is waiting first.
    """

    def __init__(self, history: int = 2048, fold_every: int = 64) -> None:
        self._step = StreamingStats()
        self._phases: dict[str, StreamingStats] = {name: StreamingStats() for name in (*PHASES, OTHER)}
        self._micro_batches = 0
        #: Steps that perfhooks' own work overlapped, and totals over the others (the steady steps).
        self.own_steps = 0
        self._steady_step = StreamingStats()
        self._steady_phase_total: dict[str, float] = dict.fromkeys((*PHASES, OTHER), 0.0)
        #: Every step's time, own ones included (ms): the run account's training time.
        self.training_ms = 0.0
        self._unfolded: list[StepTiming] = []
        self._fold_every = fold_every
        #: The most recent resolved steps, for time series and live diagnoses.
        self.recent: deque[StepTiming] = deque(maxlen=history)

    def add(self, timing: StepTiming) -> None:
        self._unfolded.append(timing)
        self.recent.append(timing)
        if len(self._unfolded) >= self._fold_every:
            self._fold()

    def _fold(self) -> None:
        batch, self._unfolded = self._unfolded, []
        if not batch:
            return
        self._step.add_many([timing.step_ms for timing in batch])
        for name, stats in self._phases.items():
            stats.add_many([timing.phase_ms.get(name, 0.0) for timing in batch])
        self._micro_batches += sum(timing.micro_batches for timing in batch)
        self.training_ms += sum(timing.step_ms for timing in batch)
        steady = [timing for timing in batch if not timing.own]
        self.own_steps += len(batch) - len(steady)
        self._steady_step.add_many([timing.step_ms for timing in steady])
        for name in self._steady_phase_total:
            self._steady_phase_total[name] += sum(timing.phase_ms.get(name, 0.0) for timing in steady)

    @property
    def step(self) -> StreamingStats:
        self._fold()
        return self._step

    @property
    def phases(self) -> dict[str, StreamingStats]:
        self._fold()
        return self._phases

    @property
    def micro_batches(self) -> int:
        self._fold()
        return self._micro_batches

    @property
    def steps(self) -> int:
        return self.step.count

    @property
    def steady_step(self) -> StreamingStats:
        """Step times (ms) of the steps no perfhooks work overlapped."""
        self._fold()
        return self._steady_step

    def steady_share(self, name: str) -> float:
        """Fraction 0..1 of steady step time spent in phase ``name`` (all steps if none is steady)."""
        total = self.steady_step.total
        if total <= 0:
            return self.share(name)
        return self._steady_phase_total[name] / total

    def steady_mean(self, name: str) -> float:
        """Mean time (ms) per steady step in phase ``name`` (over all steps if none is steady)."""
        count = self.steady_step.count
        if not count:
            return self.phases[name].mean
        return self._steady_phase_total[name] / count

    def share(self, name: str) -> float:
        """Fraction 0..1 of all step time spent in phase ``name``."""
        step_total = self.step.total
        return self.phases[name].total / step_total if step_total > 0 else 0.0

    @property
    def coverage(self) -> float:
        """Measured phases (``other`` excluded) over step time, 0..1 (may exceed 1 by clock skew on CUDA)."""
        step_total = self.step.total
        if step_total <= 0:
            return 0.0
        return sum(self.phases[name].total for name in PHASES) / step_total


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
