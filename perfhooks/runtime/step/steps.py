"""Step records: the clock marks of each optimizer step, held until the device has finished them, then resolved
into :class:`~perfhooks.report.statistics.StepTiming` (no host sync: marks are polled, never waited on per step).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from perfhooks.device.clock import HostClock
from perfhooks.events import ASIDES, DATA_WAIT, OTHER
from perfhooks.report.statistics import PhaseStatistics, StepTiming


@dataclass(slots=True)
class StepRecord:
    """The marks of one optimizer step, before they are turned into milliseconds."""

    step: int
    start: Any  # a clock mark: an int on the host, a clock.Mark on an accelerator
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
    #: torch.compile compiled during this step (the compile time itself is taken out, as an aside).
    compiled: bool = False
    #: Samples and tokens of the step's micro-batches (0: not counted).
    samples: int = 0
    tokens: int = 0
    #: Token slots, padding included, of the micro-batches whose attention_mask was read (0: none was).
    padded_tokens: int = 0
    #: The step's batch shapes (a hash; 0: no batch seen) and whether one was new to the run.
    shape: int = 0
    new_shape: bool = False


class PendingSteps:
    """Steps whose marks may still be in flight on the device; resolved in order, without blocking.

    On the host (:class:`~perfhooks.device.clock.HostClock`) a step is resolved when it ends. On a device, its
    marks are read by :meth:`resolve` on the timing reader's thread (:mod:`~perfhooks.runtime.step.timing_reader`):
    the queries and ``elapsed_time`` calls (each of which queries both events again inside torch) cost the
    training thread nothing; the training thread only moves the resolved timings into the statistics
    (:meth:`collect`). The two threads share two deques, each written at one end by one thread, and the clock's
    event pool (appends from the reader, pops from the training thread): no lock.
    """

    def __init__(self, clock: HostClock, limit: int = 512) -> None:
        self.clock = clock
        self.limit = limit
        self.dropped = 0
        #: Steps still running on the device when the close's deadline passed: not counted.
        self.unfinished = 0
        #: A timing reader resolves the device's steps on its own thread (else the training thread does).
        self.background = False
        self._queue: deque[StepRecord] = deque()
        self._resolved: deque[StepTiming] = deque()

    def push(self, record: StepRecord) -> None:
        self._queue.append(record)
        if len(self._queue) > self.limit and not self.background:
            self.discard(self._queue.popleft())
            self.dropped += 1

    def add(self, record: StepRecord, stats: PhaseStatistics) -> None:
        """Queue a step that just ended and move the steps resolved so far into ``stats``. On the device without a
        reader, the steps before it are read first: its end mark was recorded a moment ago, and asking about it
        now would be a query that almost never succeeds."""
        if self.background:  # the reader resolves it; the timings it resolved so far go to the statistics
            self._queue.append(record)
            resolved = self._resolved
            while resolved:
                stats.add(resolved.popleft())
        elif not self.clock.device_timed:
            self.push(record)
            self.drain(stats)
        else:
            self.drain(stats)
            self.push(record)

    def collect(self, stats: PhaseStatistics) -> None:
        """Move the timings the reader resolved into ``stats`` (training thread; no device call)."""
        resolved = self._resolved
        while resolved:
            stats.add(resolved.popleft())

    def __len__(self) -> int:
        return len(self._queue)

    def resolve(self) -> None:
        """Resolve every step the device has finished, in order, into the resolved queue (the timing reader's
        thread; never waits). Nothing is asked while a CUDA graph capture may be under way; the oldest steps past
        :attr:`limit` are dropped either way, so a run that is never quiet holds no more than that."""
        if self.clock.quiet():
            self._resolve_ready(self._resolved.append)
        queue = self._queue
        while len(queue) > self.limit:
            self.discard(queue.popleft())
            self.dropped += 1

    def drain(self, stats: PhaseStatistics, deadline: float | None = None) -> None:
        """Move every ready step into ``stats`` (never waits). With ``deadline`` (``time.monotonic()``; close
        only, once the reader stopped), poll each step until its marks complete or the deadline passes: steps the
        device has not finished by then are dropped and counted in :attr:`unfinished` (a hung kernel, a
        collective whose peer died)."""
        self.collect(stats)
        if deadline is None:
            self._resolve_ready(stats.add)
            return
        queue = self._queue
        while queue:
            record = queue[0]
            if not all(self.clock.wait(mark, deadline) for mark in self._marks(record)):
                self.unfinished += len(queue)
                while queue:
                    self.discard(queue.popleft())
                return
            queue.popleft()
            stats.add(self._resolve(record))
            self.discard(record)

    def _resolve_ready(self, sink: Callable[[StepTiming], None]) -> None:
        """Give ``sink`` each step at the head of the queue whose marks have all completed, in order (each step's
        marks gathered once, for the check and the release)."""
        queue = self._queue
        if not self.clock.device_timed:
            while queue:
                sink(self._resolve(queue.popleft()))
            return
        # Every mark of a step must have completed. The newest is asked first: once it has, every older mark on its
        # stream has too and costs no query; marks on another stream (a forward under ``torch.cuda.stream(s)``,
        # which may complete after the step's end) are asked for themselves.
        all_ready, release_all = self.clock.all_ready, self.clock.release_all
        if len(queue) > 1:
            all_ready(self._marks(queue[-1]))  # when the newest step is done, so is every older one on its streams
        while queue:
            record = queue[0]
            marks = self._marks(record)
            if not all_ready(marks):
                return
            queue.popleft()
            sink(self._resolve(record))
            release_all(marks)

    @staticmethod
    def _marks(record: StepRecord) -> list[Any]:
        """The step's distinct marks, in the order they were taken but for an aside's (a phase's end is the next
        phase's start: one mark). Device marks are told apart by identity; host marks are numbers, which need no
        telling apart (nothing is released or asked of them)."""
        marks = {record.start: None}
        for _, start, end in record.intervals:
            marks[start] = marks[end] = None
        if record.end is not None:
            marks[record.end] = None
        return list(marks)

    def _resolve(self, record: StepRecord) -> StepTiming:
        """Milliseconds from marks. Every phase is read on the device's timeline, ``data_wait`` included: there it
        is the *exposed* wait, the time the device sat idle for want of input (a fetch hidden behind queued
        kernels costs nothing). The host time of the fetches is kept apart as ``fetch_ms``."""
        clock = self.clock
        assert record.end is not None
        elapsed, host_ms = clock.reader(record.start), clock.host_ms
        step_ms = elapsed(record.start, record.end)
        phase_ms: dict[str, float] = {}
        covered = aside_ms = fetch_ms = 0.0
        for name, start, end in record.intervals:
            if name in ASIDES:
                aside_ms += max(0.0, elapsed(start, end))
                continue
            if name == DATA_WAIT:
                fetch_ms += max(0.0, host_ms(start, end))
            ms = elapsed(start, end)
            if ms > 0.0:
                phase_ms[name] = phase_ms.get(name, 0.0) + ms
                covered += ms
        step_ms = max(0.0, step_ms - aside_ms)
        phase_ms[OTHER] = max(0.0, step_ms - covered)
        return StepTiming(record.step, step_ms, phase_ms, record.micro_batches, record.global_step, record.own,
                          aside_ms, fetch_ms, record.compiled, record.samples, record.tokens, record.padded_tokens,
                          record.shape, record.new_shape)

    def discard(self, record: StepRecord) -> None:
        """Return a step's marks, with their device events, to the pool (host marks hold nothing); each distinct mark
        once."""
        if not self.clock.device_timed:
            return
        self.clock.release_all(self._marks(record))


class StepListener(Protocol):
    """What the rest of a run does at a step's moments (the engine routes each to its part)."""

    def step_opening(self, step: int) -> bool:
        """A step opens: drive the capture windows, sample memory, arm a FLOP count. True when perfhooks' own
        work (an open window, the writer) overlaps it. Sets :attr:`needs_detail`."""

    #: The step that just opened must be detailed (a window records it, a FLOP count or a memory history runs).
    needs_detail: bool

    def phase_opening(self, name: str) -> None:
        """Phase ``name`` starts (called only while :attr:`StepTracker.notify_phases` is set)."""

    def phase_closed(self, name: str) -> bool:
        """Phase ``name`` ended (called only while :attr:`StepTracker.observe_phases` is set, and not before
        :attr:`StepTracker.observe_after_ns`): True when a memory capture paused the step."""

    def aside_opening(self, kind: str) -> None:
        """An aside begins inside the run."""

    def step_closing(self) -> bool:
        """A step is ending: True when perfhooks' writer ran during it."""

    def step_closed(self) -> None:
        """A step ended and was queued (its timings are read once the device is done)."""
