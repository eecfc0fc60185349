"""The phase and step tracker: which step and phase are open, their clock marks, and the annotations (NVTX ranges,
profiler labels) that mark them.

The training thread drives it through the engine's events. What the other parts of a run do at these moments
(open capture windows, sample memory, count FLOPs, log rows) they do through a
:class:`~perfhooks.runtime.step.steps.StepListener`, so that the tracker holds only the state machine of a step:

- a step opens at its first phase (or ``step_start``), and ends at the next fetch after its optimizer stepped,
  at ``step_end``, or at an epoch's end (``idle``);
- phases are exclusive: starting one ends the one open;
- a step is *detailed*, *light* or *dark*, as the :class:`~perfhooks.runtime.step.sampling.StepSampler` draws at
  its start. This file holds the events' entry points and the detailed tier; the light and dark tiers and their
  transitions are :mod:`~perfhooks.runtime.step.tiers`, the publication's cadence
  :mod:`~perfhooks.runtime.step.publication`, the asides (evaluation, checkpoints, compiling, timed apart)
  :mod:`~perfhooks.runtime.step.asides`, and a step's batches and named work
  :mod:`~perfhooks.runtime.step.step_contents`. A light step's path is the first lines of :meth:`StepTracker.fetch`,
  :meth:`StepTracker.phase_end` and :meth:`StepTracker.stepped`, then :mod:`~perfhooks.runtime.step.tiers` and the
  sampler's meter; a dark block's too.

Threading: the training thread only. Other threads read the engine's published state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.autograd.profiler as autograd_profiler

from perfhooks.capture.labels import ProfilerLabels
from perfhooks.capture.nvtx import NvtxRanges
from perfhooks.device.clock import HostClock
from perfhooks.events import DATA_WAIT, PHASES
from perfhooks.faults import FaultLog
from perfhooks.report.statistics import PhaseStatistics
from perfhooks.runtime.step.asides import Asides
from perfhooks.runtime.step.batches import BatchCounter
from perfhooks.runtime.step.publication import (
    LIGHT_PUBLISH_EVERY_NS,
    LONG_PATH_SHARE,
    PUBLISH_EVERY_MAX_NS,
    Publication,
)
from perfhooks.runtime.step.run_account import RunAccount
from perfhooks.runtime.step.sampling import StepSampler
from perfhooks.runtime.step.step_contents import MAX_NAMED_WORK, StepContents
from perfhooks.runtime.step.steps import PendingSteps, StepListener, StepRecord
from perfhooks.runtime.step.tiers import SHORT_RUN, DarkFetches, LightAndDarkSteps
from perfhooks.timebase import monotonic_ns

# the tiers' and the publication's names, where the run's other parts and tests have read them
__all__ = ["LIGHT_PUBLISH_EVERY_NS", "LONG_PATH_SHARE", "MAX_NAMED_WORK", "PUBLISH_EVERY_MAX_NS", "SHORT_RUN",
           "DarkFetches", "StepListener", "StepTracker"]

_PHASE_NAMES = frozenset(PHASES)


def _no_label() -> None:
    """No ``ProfilerStep#N`` label to close (no capture windows yet)."""


class StepTracker(LightAndDarkSteps, Publication, Asides, StepContents):
    """The open step and phase of the run, their marks, and the asides between them."""

    #: What the rest of the run does at each step's moments. The listener sets itself here when it is built
    #: (``RunParts``): the two refer to each other, so the tracker is built first.
    listener: StepListener

    def __init__(self, clock: HostClock, account: RunAccount, nvtx: NvtxRanges, faults: FaultLog, *,
                 end_step_label: Callable[[], None] = _no_label, start_step: int = 0,
                 global_step: int | None = None, sampler: StepSampler | None = None) -> None:
        self.clock = clock
        self.account = account
        self.nvtx = nvtx
        self.faults = faults
        #: Closes the open ``ProfilerStep#N`` label: the capture windows', set by the engine once they are built
        #: (they are built after the tracker, whose step the all-ranks trigger's thread reads).
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
        #: Micro-batches of the last detailed step that ended (a capture window counts those it recorded).
        self.last_micro_batches = 0
        #: What the step's batches hold: samples, tokens, padding, shapes (counted on detailed steps).
        self.batches = BatchCounter()
        #: No event is taken any more (the run closed).
        self.closed = False
        #: Tell the listener of each phase start / phase end (set by the engine while a part needs it).
        self.notify_phases = False
        self.observe_phases = False
        #: ``monotonic_ns()`` before which a phase's end is not worth telling the listener (its memory sample is
        #: rate-limited): set by the listener, so that most phase ends cost a comparison, not two calls.
        self.observe_after_ns = 0
        #: Steps before this one open with no call to the listener's ``step_opening``, until ``monotonic_ns()``
        #: reaches ``quiet_until_ns`` (set by the listener when nothing is due).
        self.quiet_until_step = 0
        self.quiet_until_ns = 0
        #: ``(phase or None, monotonic() when it started, step)``, one tuple swapped in at each phase change:
        #: what the live watch reads from its own thread.
        self.phase_now: tuple[str | None, float | None, int] = (None, None, start_step)
        self.record: StepRecord | None = None
        self.phase: tuple[str, Any] | None = None
        self._nvtx_on = nvtx.active
        self._aside_mark: tuple[str, Any] | None = None  # the outermost aside inside the open step
        self._aside_labels: list[Any] = []
        #: The mark that ended the last step, for the next step's start (set only between the two, in fetch()).
        self._handoff: Any = None
        #: The steps' boundaries on the host: the clock's own marks where they are host times (a test's manual
        #: clock), else ``monotonic_ns``. perfhooks' own time is always metered on ``monotonic_ns``.
        self._step_now = clock.mark if not clock.device_timed else monotonic_ns
        self._same_clock = self._step_now is monotonic_ns
        #: Which steps are detailed, and perfhooks' cost (None: every step detailed, no meter).
        self.sampler = sampler if sampler is not None else StepSampler(None)
        self._init_light_steps()

    @property
    def open_phase(self) -> str | None:
        phase = self.phase
        if phase is not None:
            return phase[0]
        return DATA_WAIT if self._wait_from else None

    @property
    def step_open(self) -> bool:
        """A step (light or detailed) is open."""
        return self.record is not None or self.light

    # ----------------------------------------------------------------- steps
    def open_step(self, now_ns: int | None = None) -> None:
        """Open the next step at ``now_ns`` (host), light or detailed as the sampler says."""
        step = self.step
        listener = self.listener
        quiet = step < self.quiet_until_step and monotonic_ns() < self.quiet_until_ns
        if quiet:  # nothing due: no opening
            own, forced = False, self._nvtx_on
        else:
            self.quiet_until_step = 0
            own = listener.step_opening(step)
            forced = listener.needs_detail or self._nvtx_on
        if self.account.first_ns is None:
            self.account.started()
        if now_ns is None:
            now_ns = self._step_now()
        self._start_ns = now_ns
        handoff, self._handoff = self._handoff, None
        sampler = self.sampler
        if not sampler.next_is_detailed(step, forced):
            self.light = True
            self.light_stepped = self.light_compiled = self._light_phased = False
            self._light_own = own
            self._light_start_ns = now_ns
            self._light_fetch_ns = self._light_micro = self._light_aside_ns = 0
            self.phase_now = (None, now_ns / 1e9, step)
            # the light steps after this one that may end on the short path: surely light, nothing due
            self._short_left = max(0, min(SHORT_RUN, sampler.surely_light_after(), self.quiet_until_step - step - 1,
                                          self.publish_at_step - step - 1))
            if self._short_left:
                self._short_until_ns = min(self.quiet_until_ns, monotonic_ns() + self.publish_every_ns)
            return
        self._forced = forced
        self._captured = forced and not quiet and listener.needs_detail
        clock = self.clock
        clock.step_opening()
        record = StepRecord(step, handoff if handoff is not None else clock.mark())
        record.own = own
        self.record = record

    def fetch(self) -> None:
        """The loop asks its loader for a training batch: a step that stepped ends, ``data_wait`` starts. On the
        device, the step's end mark is the next step's start (one event fewer a step) when the next is detailed."""
        if self.dark_left:
            took = self._take_fast()
            left = self.dark_left
            if self.light_stepped:  # a dark step ends (the block's work, inline: most of a sampled run's steps)
                started = now = monotonic_ns()
                if not self._same_clock:
                    now = self._step_now()
                self.light_stepped = self._light_phased = False
                self._dark_last_ns = now
                self._dark_steps += 1
                self.step += 1
                short = self._short_left = self._short_left - 1
                if left > 1 and short > 0 and started < self._short_until_ns:
                    self.dark_left = left - 1
                    self._arm_fast()
                else:
                    self._end_dark(now, started)
                return
            if took:  # the fast path ended steps whose last end was not read: the block ends now
                self._dark_last_ns = self._step_now()
                self._dark_inexact = True
            self._dark_to_light()  # a second fetch in a step: the open step turns light
        started = monotonic_ns()
        if self.light_stepped and self._short_left and started < self._short_until_ns and self.light:
            try:
                self._short_fetch(started)
            except Exception as error:
                self._short_left = 0  # the long path from the next step on
                self.faults.report("fetch", error)
            return
        try:
            if self.closed:
                return
            now = started if self._same_clock else self._step_now()
            if self.light:
                if self.light_stepped:  # the light step ends here, and the next one opens
                    ended = self._end_light(now, started)
                    self.open_step(now)
                    took = monotonic_ns() - started
                    self._long_path_took(took)
                    self.sampler.boundaries_ns += took
                    started = ended
                    if not self.light:
                        self._phase_start(DATA_WAIT, now)
                        return
                elif self._light_micro:
                    self._short_left = 0  # several fetches a step: its end takes the long path
                self._wait_from = now
                self._light_micro += 1
                self.phase_now = (DATA_WAIT, now / 1e9, self.step)
                return
            record = self.record
            if record is not None and record.stepped:
                started = self._step_end(self.clock.device_timed and self.sampler.next_surely_detailed(self.step + 1),
                                         started, now)
            try:
                self._phase_start(DATA_WAIT, now)
            finally:
                self._handoff = None  # one no step took (the run closed, a fault): its event is left to the collector
        except Exception as error:
            self.faults.report("fetch", error)
        finally:
            self._own_ns += monotonic_ns() - started

    def add_own_time(self, ns: int) -> None:
        """perfhooks spent ``ns`` on this thread for the open step outside the tracker (a loop's own hooks)."""
        self._own_ns += ns

    def fetched(self, batches: int) -> None:
        """The fetch that just ended took ``batches`` micro-batches at once (transformers' prefetch of a step)."""
        record = self.record
        if batches > 1:
            if self.dark_left:
                self._dark_to_light()
            if record is not None:
                record.micro_batches += batches - 1
            elif self.light:
                self._light_micro += batches - 1
                self._short_left = 0

    def stepped(self, global_step: int | None = None) -> None:
        """The open step stepped an optimizer; ``global_step`` is the framework's counter (else one is added)."""
        if self.light:
            self.light_stepped = True
            self.global_step = global_step if global_step is not None else self.global_step + 1
            return
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
        """Start phase ``name``: ends the open phase, opens a step if none is open. In a light step, only the end
        of its data wait is taken."""
        if self.light:
            self._light_phased = True
            if self._wait_from:
                self._end_light_wait()
            return
        started = monotonic_ns()
        try:
            self._phase_start(name, None)
        finally:
            self._own_ns += monotonic_ns() - started

    def _phase_start(self, name: str, now_ns: int | None = None) -> None:
        try:
            if self.closed:
                return
            if name not in _PHASE_NAMES:
                raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
            record = self.record
            if record is None:
                self.open_step(now_ns)
                if self.light:  # the sampler made it light
                    if name == DATA_WAIT:
                        self._wait_from = self._light_start_ns
                        self._light_micro += 1
                        self.phase_now = (DATA_WAIT, self._light_start_ns / 1e9, self.step)
                    else:
                        self._light_phased = True
                    return
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
            self.phase_now = (name, monotonic_ns() / 1e9, self.step)
        except Exception as error:
            self.faults.report("phase_start", error)

    def phase_end(self, name: str) -> None:
        """End phase ``name`` if it is the open one (an unmatched end is ignored)."""
        if self.light:
            if self._wait_from and name == DATA_WAIT:
                self._end_light_wait()
            return
        try:
            if self.phase is not None and self.phase[0] == name:
                started = monotonic_ns()
                self.close_phase()
                self._own_ns += monotonic_ns() - started
        except Exception as error:
            self.faults.report("phase_end", error)

    def close_phase(self) -> Any:
        """Close the open phase; its end mark (which the next phase may start from)."""
        name, start = self.phase  # type: ignore[misc]
        self.phase = None
        now_ns = monotonic_ns()
        self.phase_now = (None, now_ns / 1e9, self.step)
        if self.labels.is_open:
            self.labels.exit()
        if self._nvtx_on:
            self.nvtx.pop()
        end = self.clock.mark()
        self.record.intervals.append((name, start, end))  # type: ignore[union-attr]
        if self.observe_phases and now_ns >= self.observe_after_ns and self.listener.phase_closed(name):
            self.record.own = True  # type: ignore[union-attr]
        return end

    def step_end(self) -> None:
        """End the open step (and its open phase); its timings are read once the device is done."""
        if self.dark_left:
            self._dark_to_light()
        started = monotonic_ns()
        try:
            now = started if self._same_clock else self._step_now()
            if self.light:
                self._end_light(now, started)
            else:
                self._own_ns += self._step_end(False, started, now) - started
        except Exception as error:
            self.faults.report("step_end", error)

    def _step_end(self, handoff: bool, started: int, now: int) -> int:
        """End the open detailed step at ``now`` (its host clock), perfhooks having entered at ``started``
        (``monotonic_ns``); ``handoff``: the next step opens now (a fetch), from this step's end mark. When its
        end's work finished (``monotonic_ns``)."""
        try:
            record = self.record
            if record is None:
                return started
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
            self.last_micro_batches = record.micro_batches
            if self.listener.step_closing():
                record.own = True
            step = self.step
            self.step = step + 1
            self.pending.add(record, self.stats)
            sampler = self.sampler
            if (self._forced or now >= self._publish_at or self.step >= self.publish_at_step
                    or sampler.budget is None or step < sampler.warmup_steps):
                self._publish_at = now + self.publish_every_ns
                self.listener.step_closed()
        except Exception as error:
            self.faults.report("step_end", error)
            return started
        done = monotonic_ns()
        self.sampler.step_ended(True, self._own_ns + done - started, now - self._start_ns, not self._forced, step,
                                now, self._captured)
        self._own_ns = 0
        return done

    def idle(self) -> None:
        """Time from now until the next phase belongs to no step (an epoch's end, the loader ran out)."""
        if self.dark_left:
            self._dark_to_light()
        if self.light:
            now = self._step_now()
            if self.light_stepped:
                self._end_light(now, monotonic_ns())
            elif not self._light_phased:
                self.drop_record()  # only waited so far: that wait was not for a training batch
            elif self._wait_from:
                self._light_fetch_ns += now - self._wait_from
                self._wait_from = 0
            return
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
        """The open step is no step: close its ``ProfilerStep`` label and return its marks."""
        self.end_step_label()
        self._own_ns = 0
        if self.dark_left:
            self._dark_to_light()
        if self.light:
            if self._short_walls:
                self._fold_short()
            self.light = False
            self._wait_from = 0
            self._short_left = 0
            return
        record, self.record = self.record, None
        self.pending.discard(record)  # type: ignore[arg-type]

    def end_open_step(self, count_last: bool) -> None:
        """At close: end an aside cut short, count a last step that stepped (when ``count_last``), drop one cut
        short."""
        while self.account.depth:
            self.aside_end(self.account.innermost)  # type: ignore[arg-type]
        if self.dark_left:
            self._dark_to_light()
        if self.light:
            if self.light_stepped and count_last:
                self._end_light(self._step_now(), monotonic_ns())
            else:
                self.drop_record()
            return
        if self.phase is not None:
            self.close_phase()
        if self.record is not None and self.record.stepped and count_last:
            self.step_end()  # the last step: its optimizer stepped (an error after that too)
        if self.record is not None:  # a step cut short (end of data or an error) is not counted
            self.drop_record()

    # ----------------------------------------------------------------- asides
