"""The phase and step tracker: which step and phase are open, their clock marks, asides, and the annotations
(NVTX ranges, profiler labels) that mark them.

The training thread drives it through the engine's events. What the other parts of a run do at these moments
(open capture windows, sample memory, count FLOPs, log rows) they do through a :class:`StepListener`, so that
this file holds only the state machine of a step:

- a step opens at its first phase (or ``step_start``), and ends at the next fetch after its optimizer stepped,
  at ``step_end``, or at an epoch's end (``idle``);
- phases are exclusive: starting one ends the one open;
- an aside (evaluation, a checkpoint, compiling) is timed apart and taken out of the step it interrupts.

Threading: the training thread only. Other threads read the engine's published state.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import torch.autograd.profiler as autograd_profiler
from torch import Tensor

from perfhooks.capture.labels import ProfilerLabels
from perfhooks.capture.nvtx import NvtxRanges
from perfhooks.device.clock import HostClock
from perfhooks.events import ASIDES, DATA_WAIT, PHASES
from perfhooks.faults import FaultLog
from perfhooks.report.statistics import PhaseStatistics
from perfhooks.runtime.batches import (
    FROM_HOST_MASK,
    FROM_IDS_MASK_ON_DEVICE,
    BatchCount,
    batch_shape,
    count_batch,
    host_mask,
)
from perfhooks.runtime.run_account import RunAccount
from perfhooks.runtime.steps import PendingSteps, StepRecord
from perfhooks.timebase import monotonic_ns

_PHASE_NAMES = frozenset(PHASES)
#: Names kept in :attr:`StepTracker.named_work` (a framework names a fixed set of hooks; this bounds a
#: pathological one).
MAX_NAMED_WORK = 256
#: Distinct batch shapes remembered: past it, no shape counts as new (a run with a fresh shape every step).
MAX_SHAPES = 4096


#: Tensors in a tuple or list batch that is looked up by its shapes (a longer one is counted each time).
MAX_KEYED_ITEMS = 8


def _tensor_batch_key(batch: Any) -> tuple[Any, ...] | None:
    """The shapes and dtypes of a batch that is a tensor, or a tuple or list of tensors (``x``, ``(x, y)``): all
    its count and shape depend on, so one count serves every batch with the same key. None for anything else (a
    mapping's count may read its attention mask's values)."""
    kind = type(batch)
    if kind is Tensor:
        return (batch.shape, batch.dtype)
    if (kind is tuple or kind is list) and 0 < len(batch) <= MAX_KEYED_ITEMS:
        key: list[Any] = [kind]
        for item in batch:
            if type(item) is not Tensor:
                return None
            key.append(item.shape)
            key.append(item.dtype)
        return tuple(key)
    return None


class StepListener(Protocol):
    """What the rest of a run does at a step's moments (the engine routes each to its part)."""

    def step_opening(self, step: int) -> bool:
        """A step opens: drive the capture windows, sample memory, arm a FLOP count. True when perfhooks' own
        work (an open window, the writer) overlaps it."""

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


class StepTracker:
    """The open step and phase of the run, their marks, and the asides between them."""

    def __init__(self, clock: HostClock, account: RunAccount, nvtx: NvtxRanges, faults: FaultLog,
                 listener: StepListener, end_step_label: Any, start_step: int = 0,
                 global_step: int | None = None) -> None:
        self.clock = clock
        self.account = account
        self.nvtx = nvtx
        self.faults = faults
        self.listener = listener
        #: Closes the open ``ProfilerStep#N`` label (the capture windows').
        self.end_step_label = end_step_label
        self.stats = PhaseStatistics()
        self.pending = PendingSteps(clock)
        self.labels = ProfilerLabels()
        self.step = start_step
        #: The framework's own step counter (Lightning ``global_step``, transformers ``state.global_step``, or the
        #: optimizer steps counted here).
        self.global_step = start_step if global_step is None else global_step
        #: Host work the framework named while a step was open (a Lightning callback's hooks): name -> ms in all.
        self.named_work: dict[str, float] = {}
        #: The framework's named hooks are timed in the open step (an integration may time one step in several:
        #: the steps it leaves out are counted in :attr:`unnamed_steps`, out of the per-step figure).
        self.naming = True
        self.unnamed_steps = 0
        #: The batch's token count's source, once a batch was counted.
        self.token_source: str | None = None
        #: The batch shapes seen so far (bounded): a step that meets a new one may pay for it (shape churn).
        self.shapes: set[tuple[Any, ...]] = set()
        #: A tensor batch's count and shape by its shapes and dtypes (:func:`_tensor_batch_key`): each kind is
        #: counted once.
        self._tensor_batches: dict[tuple[Any, ...], tuple[BatchCount | None, Any]] = {}
        #: The training batches' masks as the DataLoader gave them, on the host, before the framework moved them
        #: (:mod:`~perfhooks.runtime.host_batches`), in order: each batch seen on the device takes the oldest and
        #: sums it only when its own mask is off the host. Bounded: a prefetching loader is a batch or two ahead.
        self.host_masks: deque[Any] = deque(maxlen=8)
        #: No event is taken any more (the run closed).
        self.closed = False
        #: Tell the listener of each phase start / phase end (set by the engine while a part needs it).
        self.notify_phases = False
        self.observe_phases = False
        #: ``monotonic_ns()`` before which a phase's end is not worth telling the listener (its memory sample is
        #: rate-limited): set by the listener, so that most phase ends cost a comparison, not two calls.
        self.observe_after_ns = 0
        #: ``(phase or None, monotonic() when it started, step)``, one tuple swapped in at each phase change:
        #: what the live watch reads from its own thread.
        self.beacon: tuple[str | None, float | None, int] = (None, None, start_step)
        self.record: StepRecord | None = None
        self.phase: tuple[str, Any] | None = None
        self._nvtx_on = nvtx.active
        self._aside_mark: tuple[str, Any] | None = None  # the outermost aside inside the open step
        self._aside_labels: list[Any] = []
        #: The mark that ended the last step, for the next step's start (set only between the two, in fetch()).
        self._handoff: Any = None

    @property
    def open_phase(self) -> str | None:
        return self.phase[0] if self.phase else None

    # ----------------------------------------------------------------- steps
    def open_step(self) -> None:
        step = self.step
        own = self.listener.step_opening(step)
        if self.account.first_ns is None:
            self.account.started()
        handoff, self._handoff = self._handoff, None
        clock = self.clock
        clock.step_opening()
        record = StepRecord(step, handoff if handoff is not None else clock.mark())
        record.own = own
        self.record = record

    def fetch(self) -> None:
        """The loop asks its loader for a training batch: a step that stepped ends, ``data_wait`` starts. On the
        device, the step's end mark is the next step's start (one event fewer a step)."""
        try:
            if self.closed:
                return
            record = self.record
            if record is not None and record.stepped:
                self.step_end(handoff=self.clock.device_timed)
            try:
                self.phase_start(DATA_WAIT)
            finally:
                self._handoff = None  # one no step took (the run closed, a fault): its event is left to the collector
        except Exception as error:
            self.faults.report("fetch", error)

    def fetched(self, batches: int) -> None:
        """The fetch that just ended took ``batches`` micro-batches at once (transformers' prefetch of a step)."""
        record = self.record
        if record is not None and batches > 1:
            record.micro_batches += batches - 1

    def host_batch(self, batch: Any) -> None:
        """The DataLoader handed over a batch on the host (this thread, inside a training fetch): its mask is kept
        for the batch the framework will give :meth:`batch` on the device, whose mask could not be read there."""
        if self.closed or self.open_phase != DATA_WAIT:
            return
        try:
            self.host_masks.append(host_mask(batch))
        except Exception as error:
            self.faults.report("host_batch", error)

    def batch(self, batch: Any) -> None:
        """A micro-batch of the open step is in hand: its samples and tokens count (shapes only, no device sync)."""
        try:
            record = self.record
            if record is None or self.closed:
                return
            key = _tensor_batch_key(batch)
            if key is not None:  # ``x`` or ``(x, y)``: counted once per shapes and dtypes, then looked up
                known = self._tensor_batches.get(key)
                if known is None:
                    known = self._count_tensor_batch(key, batch)
                counted, shape = known
                if counted is None:
                    return
            else:
                counted, shape = count_batch(batch), None
                if counted is None:
                    return
            if self.host_masks:  # the same batch as the DataLoader gave it, in order
                mask = self.host_masks.popleft()
                if counted.token_source != FROM_IDS_MASK_ON_DEVICE:
                    self.host_masks.clear()  # a mask readable here (a CPU run): the host's are not needed
                elif mask is not None and int(mask.shape[0]) == counted.samples:
                    counted = BatchCount(counted.samples, int(mask.sum()), FROM_HOST_MASK, int(mask.numel()))
            record.samples += counted.samples
            record.tokens += counted.tokens
            record.padded_tokens += counted.padded
            if shape is None:
                shape = batch_shape(batch)
                self._note_shape(record, shape)
            record.shape = hash((record.shape, shape))
            if counted.token_source is not None:
                self.token_source = counted.token_source
        except Exception as error:
            self.faults.report("batch", error)

    def _count_tensor_batch(self, key: tuple[Any, ...], batch: Any) -> tuple[BatchCount | None, Any]:
        """Count a batch of tensors whose shapes and dtypes were not seen before, and note its shape: what
        :meth:`batch` looks up for every later batch like it (bounded, as the shapes are)."""
        counted = count_batch(batch)
        shape = batch_shape(batch)
        if counted is not None:
            self._note_shape(self.record, shape)  # type: ignore[arg-type]
        if len(self._tensor_batches) < MAX_SHAPES:
            self._tensor_batches[key] = (counted, shape)
        return counted, shape

    def _note_shape(self, record: StepRecord, shape: tuple[Any, ...]) -> None:
        if shape not in self.shapes and len(self.shapes) < MAX_SHAPES:
            self.shapes.add(shape)
            record.new_shape = True

    def named(self, name: str, ms: float) -> None:
        """Host work the framework named took ``ms`` while a training step was open (not in an aside). A Lightning
        step names about 24 callback hooks: one frame each, the aside check an attribute, not a property."""
        try:
            if self.record is None or self.account.open_asides:
                return
            work = self.named_work
            known = work.get(name)
            if known is not None:
                work[name] = known + ms
            elif len(work) < MAX_NAMED_WORK:
                work[name] = ms
        except Exception as error:
            self.faults.report("named", error)

    def stepped(self, global_step: int | None = None) -> None:
        """The open step stepped an optimizer; ``global_step`` is the framework's counter (else one is added)."""
        try:
            record = self.record
            if record is None or self.closed:
                return
            record.stepped = True
            self.global_step = global_step if global_step is not None else self.global_step + 1
            record.global_step = self.global_step
        except Exception as error:
            self.faults.report("stepped", error)

    # The three methods below run several times per step: NVTX and label calls are skipped when neither is on, and
    # each guards itself (a fault is reported once, under its own name), so the engine hands them out directly.
    def phase_start(self, name: str) -> None:
        """Start phase ``name``: ends the open phase, opens a step if none is open."""
        try:
            if self.closed:
                return
            if name not in _PHASE_NAMES:
                raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
            record = self.record
            if record is None:
                self.open_step()
                record = self.record
                mark = record.start  # type: ignore[union-attr]
            else:
                phase = self.phase
                if phase is None:
                    mark = self.clock.mark()
                elif phase[0] == name:
                    return
                else:  # the open phase ends where this one starts: close_phase(), inline (most boundaries)
                    self.phase = None
                    if self.labels.is_open:
                        self.labels.exit()
                    if self._nvtx_on:
                        self.nvtx.pop()
                    mark = self.clock.mark()
                    record.intervals.append((phase[0], phase[1], mark))
                    if (self.observe_phases and monotonic_ns() >= self.observe_after_ns
                            and self.listener.phase_closed(phase[0])):
                        record.own = True
            if name == DATA_WAIT:  # each fetch is one micro-batch (see fetched() for loaders that take several)
                record.micro_batches += 1  # type: ignore[union-attr]
            if self.notify_phases:
                self.listener.phase_opening(name)
            if self._nvtx_on:
                self.nvtx.push(name)
            if autograd_profiler._is_profiler_enabled:
                self.labels.enter(name)
            self.phase = (name, mark)
            self.beacon = (name, monotonic_ns() / 1e9, self.step)
        except Exception as error:
            self.faults.report("phase_start", error)

    def phase_end(self, name: str) -> None:
        """End phase ``name`` if it is the open one (an unmatched end is ignored)."""
        try:
            if self.phase is not None and self.phase[0] == name:
                self.close_phase()
        except Exception as error:
            self.faults.report("phase_end", error)

    def close_phase(self) -> Any:
        """Close the open phase; its end mark (which the next phase may start from)."""
        name, start = self.phase  # type: ignore[misc]
        self.phase = None
        now_ns = monotonic_ns()
        self.beacon = (None, now_ns / 1e9, self.step)
        if self.labels.is_open:
            self.labels.exit()
        if self._nvtx_on:
            self.nvtx.pop()
        end = self.clock.mark()
        self.record.intervals.append((name, start, end))  # type: ignore[union-attr]
        if self.observe_phases and now_ns >= self.observe_after_ns and self.listener.phase_closed(name):
            self.record.own = True  # type: ignore[union-attr]
        return end

    def step_end(self, handoff: bool = False) -> None:
        """End the open step (and its open phase); its timings are read once the device is done. ``handoff``: the
        next step opens now (a fetch), from this step's end mark."""
        try:
            record = self.record
            if record is None:
                return
            record.end = self.close_phase() if self.phase is not None else self.clock.mark()
            if handoff:  # shared before the record is queued: the timing reader may release it from then on
                self._handoff = self.clock.share(record.end)
            self.end_step_label()
            self.record = None
            if record.global_step is None:
                record.global_step = self.global_step
            if not self.naming:
                self.unnamed_steps += 1
            record.micro_batches = max(1, record.micro_batches)  # a loop that reports no fetch: one batch
            if self.listener.step_closing():
                record.own = True
            self.step += 1
            self.pending.add(record, self.stats)
            self.listener.step_closed()
        except Exception as error:
            self.faults.report("step_end", error)

    def idle(self) -> None:
        """Time from now until the next phase belongs to no step (an epoch's end, the loader ran out)."""
        if self.phase is not None:
            self.close_phase()
        record = self.record
        if record is None:
            return
        if record.stepped:
            self.step_end()
        elif all(name == DATA_WAIT for name, _, _ in record.intervals):
            self.drop_record()  # only waited so far: that wait was not for a training batch

    def drop_record(self) -> None:
        """The open record is no step: close its ``ProfilerStep`` label and return its marks."""
        record, self.record = self.record, None
        self.end_step_label()
        self.pending.discard(record)  # type: ignore[arg-type]

    def end_open_step(self, count_last: bool) -> None:
        """At close: end an aside cut short, count a last step that stepped (when ``count_last``), drop one cut
        short."""
        while self.account.depth:
            self.end_aside(self.account.innermost)  # type: ignore[arg-type]
        if self.phase is not None:
            self.close_phase()
        if self.record is not None and self.record.stepped and count_last:
            self.step_end()  # the last step: its optimizer stepped (an error after that too)
        if self.record is not None:  # a step cut short (end of data or an error) is not counted
            self.drop_record()

    # ----------------------------------------------------------------- asides
    def begin_aside(self, kind: str) -> None:
        """Evaluation or a checkpoint write starts: timed apart, out of the open step and its ``ProfilerStep``."""
        if self.closed:
            return
        if kind not in ASIDES:
            raise ValueError(f"unknown aside {kind!r}; asides are {', '.join(sorted(ASIDES))}")
        self.listener.aside_opening(kind)
        if self.phase is not None:
            self.close_phase()
        self.end_step_label()
        if self.account.depth == 0 and self.record is not None:
            self._aside_mark = (kind, self.clock.mark())
        self.account.begin(kind)
        if self._nvtx_on:
            self.nvtx.push(kind)
        label = None
        if autograd_profiler._is_profiler_enabled:
            label = autograd_profiler.record_function(kind)
            label.__enter__()
        self._aside_labels.append(label)

    def end_aside(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) ends; an unmatched end is ignored."""
        if not self.account.end(kind):
            return
        self._pop_aside_annotations()
        if self.account.depth == 0 and self._aside_mark is not None:
            outer, start = self._aside_mark
            self._aside_mark = None
            if self.record is not None:
                self.record.intervals.append((outer, start, self.clock.mark()))

    def retract_aside(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) was not one: it is neither counted nor timed, and what
        follows belongs to the step that opens next."""
        if not self.account.retract(kind):
            return
        self._pop_aside_annotations()
        if self.account.depth == 0:
            self._aside_mark = None

    def _pop_aside_annotations(self) -> None:
        """Close the innermost aside's profiler label and NVTX range."""
        label = self._aside_labels.pop() if self._aside_labels else None
        if label is not None:
            label.__exit__(None, None, None)
        if self._nvtx_on:
            self.nvtx.pop()

    def named_work_per_step(self) -> dict[str, float]:
        """The largest named work, ms per step over the steps whose hooks were timed (the 10 largest)."""
        steps = max(self.stats.steps - self.unnamed_steps, 1)
        ranked = sorted(self.named_work.items(), key=lambda item: -item[1])[:10]
        return {name: round(ms / steps, 4) for name, ms in ranked}
