"""The phase and step tracker: which step and phase are open, their clock marks, asides, and the annotations
(NVTX ranges, profiler labels) that mark them.

The training thread drives it through the engine's events. What the other parts of a run do at these moments
(open capture windows, sample memory, count FLOPs, log rows) they do through a :class:`StepListener`, so that
this file holds only the state machine of a step:

- a step opens at its first phase (or ``step_start``), and ends at the next fetch after its optimizer stepped,
  at ``step_end``, or at an epoch's end (``idle``);
- phases are exclusive: starting one ends the one open;
- an aside (evaluation, a checkpoint, compiling) is timed apart and taken out of the step it interrupts;
- a step is *detailed* (its phases get device marks, its batch is counted, the listener hears its phases) or
  *light* (its start and end, and its data wait, on the host clock; nothing else), as the
  :class:`~perfhooks.runtime.step.sampling.StepSampler` decides at its start. A light step's whole path is the first
  lines of :meth:`StepTracker.fetch`, :meth:`StepTracker.phase_end` and :meth:`StepTracker.stepped`; most light
  steps end on the short path (:meth:`StepTracker._short_fetch`: three appends and the next step's start), and
  :meth:`StepTracker._fold_short` gives their figures to the statistics and the sampler together, at the next
  step that ends on the long path (:meth:`StepTracker._end_light`, then :meth:`StepTracker.open_step`). Every
  other event returns at its first check.

A detailed step's batch is counted by :class:`~perfhooks.runtime.step.batches.BatchCounter`, which the tracker
hands the open record.

Threading: the training thread only. Other threads read the engine's published state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch.autograd.profiler as autograd_profiler

from perfhooks.capture.labels import ProfilerLabels
from perfhooks.capture.nvtx import NvtxRanges
from perfhooks.device.clock import HostClock
from perfhooks.events import ASIDES, DATA_WAIT, PHASES
from perfhooks.faults import FaultLog
from perfhooks.report.statistics import UNTIMED_FETCH, PhaseStatistics
from perfhooks.runtime.step.batches import BatchCounter
from perfhooks.runtime.step.run_account import RunAccount
from perfhooks.runtime.step.sampling import LIGHT_BLOCK, StepSampler
from perfhooks.runtime.step.steps import PendingSteps, StepRecord
from perfhooks.timebase import monotonic_ns

_PHASE_NAMES = frozenset(PHASES)
#: Names kept in :attr:`StepTracker.named_work` (a framework names a fixed set of hooks; this bounds a
#: pathological one).
MAX_NAMED_WORK = 256
#: Light steps and the detailed steps the sampler drew publish the run's state at most this often (ns of their
#: clock; more seldom as the long path costs more, :attr:`StepTracker.publish_every_ns`), unless the listener asks for
#: a step (:attr:`StepTracker.publish_at_step`). The run's first steps (the sampler's warm-up), steps a window or a
#: count forced, and every step when every step is detailed (no budget) publish at their end.
LIGHT_PUBLISH_EVERY_NS = 20_000_000
#: The long path (what light steps fold, the published state, a step's opening) comes at most every
#: :data:`LIGHT_PUBLISH_EVERY_NS`, and further apart as it costs more, so that its cost in place stays within
#: :data:`LONG_PATH_SHARE` of the steps' clock; never more than :data:`PUBLISH_EVERY_MAX_NS` apart (a signal's report
#: or ``top`` may miss the last second of steps, not more).
PUBLISH_EVERY_MAX_NS = 1_000_000_000
#: The long path's share of the steps' clock, in place: half of 0.1%, since on the wall clock it costs more (its
#: Python slows the user's next steps; 1.5 to 3 times on the simulated launch-bound loop).
LONG_PATH_SHARE = 0.0005
#: Light steps in a row that may end on the short path before the long one folds them (and publishes).
SHORT_RUN = 8192
class DarkFetches:
    """A plain loop's dark steps between the tracker's looks (:meth:`StepTracker.fetch` at a block's ends): its fetch
    and its optimizer's hook touch only this small object (the tracker's state is cold by then, and each attribute
    of it read costs a launch-bound step more than its own time). ``left``: steps the loop may end by itself (0:
    none; it ends one while more than one is left, ``open`` and the step ``stepped``); ``steps``, ``hooks``: the
    steps it ended and the optimizer's step hooks called since the tracker last looked; ``open`` goes False when the
    run wants the block to end at the next step (a signal's wake, another thread: one attribute write)."""

    __slots__ = ("hooks", "left", "open", "stepped", "steps")

    def __init__(self) -> None:
        self.left = self.steps = self.hooks = 0
        self.stepped = False
        self.open = True


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


def _no_label() -> None:
    """No ``ProfilerStep#N`` label to close (no capture windows yet)."""


class StepTracker:
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

    def _init_light_steps(self) -> None:
        """The state of light steps, the short path and perfhooks' meter (:mod:`~perfhooks.runtime.step.sampling`)."""
        #: The open step is light (``record`` is None then): its fields below, on the host clock (ns).
        self.light = False
        self.light_stepped = False
        self.light_compiled = False
        self._light_own = False
        self._light_phased = False  # a phase other than data_wait was told in it
        self._light_start_ns = 0
        self._light_fetch_ns = 0
        self._light_micro = 0
        self._light_aside_ns = 0
        self._light_aside_from = 0
        #: A light step's end publishes the run's state from then on (its clock, ns), or from the step
        #: ``publish_at_step`` on (the listener's next W&B rows); so does a drawn detailed step's past the warm-up
        #: (:data:`LIGHT_PUBLISH_EVERY_NS`).
        self.publish_at_step = 1 << 62
        self._publish_at = 0
        #: How often the long path is taken (ns): :data:`LIGHT_PUBLISH_EVERY_NS` and up, from its cost in place
        #: (``_long_path_ns``, a running mean of the latest long paths' own ns; :meth:`_long_path_took`).
        self.publish_every_ns = LIGHT_PUBLISH_EVERY_NS
        self._long_path_ns = 0.0
        #: The light step's data wait started then (0: not waiting).
        self._wait_from = 0
        #: Light steps that may still end on the short path (:meth:`_short_fetch`), until ``monotonic_ns()``
        #: reaches ``_short_until_ns``; the wall, fetch and own ns of those that did, waiting to be folded.
        self._short_left = 0
        self._short_until_ns = 0
        self._short_walls: list[int] = []
        self._short_fetches: list[int] = []
        self._short_owns: list[int] = []
        #: The open dark block (:meth:`fetch` ends each of its steps): its steps left (0: none open; a loop's hooks
        #: read it to return at once), its start and its last step's end (the steps' clock, ns), its steps so far;
        #: where in ``_short_walls`` the light steps since the last block start, and the light steps on the short
        #: path until the next draw of a block's kind.
        self.dark_left = 0
        #: The plain loop's fast path through the open dark block (:class:`DarkFetches`), armed for a loop that said
        #: it takes it (``fast_path``: its fetches and optimizer hooks, on the steps' own clock).
        self.fast = DarkFetches()
        self.fast_path = False
        self._dark_start_ns = self._dark_last_ns = 0
        #: The open block's last step ended at an unknown time (the loop's fast path reads no clock), so its mean
        #: step does not price a light step.
        self._dark_inexact = False
        self._dark_steps = 0
        self._light_run_from = 0
        self._light_block_left = LIGHT_BLOCK
        #: The open detailed step was forced (a window, a count, NVTX), not drawn by the sampler; by a capture
        #: (a window, a FLOP count, an allocation history), whose cost is reported apart from the budget's.
        self._forced = False
        self._captured = False
        #: perfhooks' own time on this thread in the open step so far (ns), and the open step's host start.
        self._own_ns = 0
        self._start_ns = 0

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

    def _short_fetch(self, started: int) -> None:
        """The short path of a light step's end (most of a sampled run's steps): the step that stepped is noted
        and the next, light too, opens with its data wait. What the long path does at each step end (the
        statistics, the sampler, the published state) is done for these steps together, at the next long one
        (:meth:`_fold_short`), at most :data:`SHORT_RUN` steps and :attr:`publish_every_ns` later."""
        now = started if self._same_clock else self._step_now()
        fetch_ns = self._light_fetch_ns
        if self._wait_from:
            fetch_ns += now - self._wait_from
        self._short_walls.append(now - self._light_start_ns)
        self._short_fetches.append(fetch_ns)
        self._short_owns.append(self._own_ns)
        if not self.naming:
            self.unnamed_steps += 1
        step = self.step = self.step + 1
        self._short_left -= 1
        self.light_stepped = self._light_phased = False
        self._light_start_ns = self._wait_from = now
        self._light_fetch_ns = 0
        self._light_micro = 1
        self.phase_now = (DATA_WAIT, now / 1e9, step)
        left = self._light_block_left - 1
        self._light_block_left = left
        if left <= 0:  # a block of light steps ended: the next block is light or dark, at random
            self._light_block_left = LIGHT_BLOCK
            self._maybe_dark(now)
        self._own_ns = monotonic_ns() - started

    # ----------------------------------------------------------------- dark steps
    def _maybe_dark(self, now: int) -> None:
        """The step that opened at ``now`` starts a dark block, if the sampler draws one and the steps surely light
        from here hold it."""
        surely = self._short_left
        walls = self._short_walls
        if self.fast_path and walls and walls[-1] > 0:  # its fast path reads no clock: the block fits the horizon
            surely = min(surely, int((self._short_until_ns - monotonic_ns()) // walls[-1]))
        steps = self.sampler.dark_block(surely)
        if not steps:
            return
        self.dark_left = steps
        self._dark_start_ns = self._dark_last_ns = now
        self._dark_steps = 0
        self._dark_inexact = False
        self._arm_fast()
        self._wait_from = 0  # a dark step's wait is not timed
        self.phase_now = (None, now / 1e9, self.step)

    def _close_dark(self) -> None:
        """The open dark block's ended steps, into the statistics and the sampler; no block is open after."""
        steps, wall = self._dark_steps, self._dark_last_ns - self._dark_start_ns
        self.dark_left = self._dark_steps = 0
        self.fast.left = 0
        # the light steps before it, less the first after a boundary (its wall holds the long path's or the last
        # block's bookkeeping, which dark steps pay too)
        walls = self._short_walls
        before = walls[max(self._light_run_from + 1, len(walls) - LIGHT_BLOCK):]
        self._light_run_from = len(self._short_walls)
        self._light_block_left = LIGHT_BLOCK
        if walls and self.sampler.pair_open:  # a detailed step's light neighbour after it is among them: told first
            self._fold_short()
        if steps:
            self.stats.add_dark(steps, wall, self._light_own or self.listener.step_closing())
            self.sampler.dark_ended(steps, wall, [] if self._dark_inexact else before, self.step - 1,
                                    self._dark_last_ns)

    def _end_dark(self, now: int, started: int) -> None:
        """The dark block ends with its last step at ``now`` (the steps' clock; ``started``: ``monotonic_ns``); the
        next step opens: light on the short path when it may, else as the long path opens a step."""
        try:
            self._close_dark()
            if self.closed:  # the run closed while the block ran: no step opens
                return
            if self._short_left > 0 and started < self._short_until_ns:
                self._light_start_ns = self._wait_from = now
                self._light_fetch_ns = 0
                self._light_micro = 1
                self.phase_now = (DATA_WAIT, now / 1e9, self.step)
                self._maybe_dark(now)  # the next block may be dark too
                return
            self.light = False
            if self._short_walls:
                self._fold_short()
            if self.pending._resolved:
                self.pending.collect(self.stats)
            self._publish_if_due(now)
            self.open_step(now)
            self._long_path_took(monotonic_ns() - started)
            if self.light:
                self._wait_from = now
                self._light_micro = 1
                self.phase_now = (DATA_WAIT, now / 1e9, self.step)
            else:
                self._phase_start(DATA_WAIT, now)
        except Exception as error:
            self.dark_left = 0
            self.faults.report("fetch", error)
        finally:
            own = self._own_ns = monotonic_ns() - started
            self.sampler.boundaries_ns += own

    def _dark_to_light(self) -> None:
        """The open dark block ends before its time (an aside, the loader's end, a second fetch, the close): its
        ended steps are counted, and the step in progress is the open light step, from the last one's end (from
        now, when the loop's fast path ended steps since the last look: their last end was not read)."""
        if self._take_fast():
            self._dark_last_ns = self._step_now()
            self._dark_inexact = True
        self._close_dark()
        self._short_left = 0
        self._light_start_ns = self._dark_last_ns
        self._light_fetch_ns = UNTIMED_FETCH  # its wait was not timed: it stays out of the fetch figures
        self._light_aside_ns = 0
        self._light_micro = 1
        self._wait_from = 0

    def _arm_fast(self) -> None:
        """The loop may end the open block's next steps by itself (:class:`DarkFetches`), all but its last."""
        if not self.fast_path:
            return
        fast = self.fast
        fast.steps = fast.hooks = 0
        fast.stepped = self.light_stepped
        fast.open = True
        fast.left = self.dark_left

    def _take_fast(self) -> bool:
        """Take what the loop's fast path counted since the last look into the block (steps, the optimizer's steps,
        the open step's stepped); it stops until armed again. True when it ended steps."""
        fast = self.fast
        steps = fast.steps
        if steps:
            self.step += steps
            self._dark_steps += steps
            self.dark_left -= steps
            self._short_left -= steps
        if fast.hooks:
            self.global_step += fast.hooks
        if fast.stepped:
            self.light_stepped = True
        fast.left = fast.steps = fast.hooks = 0
        fast.stepped = False
        return bool(steps)

    def _fold_short(self) -> None:
        """The light steps that ended on the short path, into the statistics and the sampler (in order)."""
        walls, fetches, owns = self._short_walls, self._short_fetches, self._short_owns
        self._short_walls, self._short_fetches, self._short_owns = [], [], []
        self._light_run_from = 0
        own = self._light_own or self.listener.step_closing()  # perfhooks' writer ran in these steps
        self.stats.add_lights(walls, fetches, own)
        self.sampler.lights_ended(walls, owns, self.step, self._light_start_ns)

    def wake(self) -> None:
        """The next step opens on the long path, with the listener's ``step_opening`` (a signal's handler may call
        it: it only sets two attributes)."""
        self.quiet_until_step = 0
        self._short_left = 0
        self._short_until_ns = 0  # an open dark block ends at its next step's end
        self.fast.open = False

    def publish_soon(self) -> None:
        """The next step's end publishes the run's state (another thread may call it: two attribute writes)."""
        self._publish_at = 0
        self._short_left = 0
        self._short_until_ns = 0
        self.fast.open = False

    def stop(self) -> None:
        """No event is taken from now on (the run closes)."""
        self.closed = True
        self._short_left = 0
        self._short_until_ns = 0
        self.fast.open = False

    def light_compiled_now(self) -> None:
        """torch.compile compiled in the open light step: it is not steady, and it ends on the long path."""
        if self.dark_left:
            self._dark_to_light()
        self.light_compiled = True
        self._short_left = 0

    def add_own_time(self, ns: int) -> None:
        """perfhooks spent ``ns`` on this thread for the open step outside the tracker (a loop's own hooks)."""
        self._own_ns += ns

    def _end_light(self, now_ns: int, started: int) -> int:
        """End the open light step at ``now_ns`` (its clock), perfhooks having entered at ``started``
        (``monotonic_ns``): its times go to the statistics; when its end's work finished (``monotonic_ns``)."""
        self.light = False
        if self._short_walls:
            self._fold_short()
        fetch_ns = self._light_fetch_ns
        wait_from = self._wait_from
        if wait_from:
            fetch_ns += now_ns - wait_from
            self._wait_from = 0
        wall_ns = now_ns - self._light_start_ns
        listener = self.listener  # no ProfilerStep label to close: a window's steps are detailed
        step = self.step
        self.stats.add_light(wall_ns - self._light_aside_ns, fetch_ns, self._light_micro,
                             listener.step_closing() or self._light_own, self.light_compiled)
        if not self.naming:
            self.unnamed_steps += 1
        self.step = step + 1
        if self.pending._resolved:
            self.pending.collect(self.stats)
        self._publish_if_due(now_ns)
        done = monotonic_ns()
        self.sampler.light_ended(self._own_ns + done - started, wall_ns, step, now_ns)
        self._own_ns = 0
        return done

    def _long_path_took(self, ns: int) -> None:
        """A light step or a dark block ended on the long path, which took ``ns`` in place: the next come far enough
        apart (:attr:`publish_every_ns`) that the long path's running mean cost stays within
        :data:`LONG_PATH_SHARE` of the steps' clock."""
        mean = self._long_path_ns = ns if not self._long_path_ns else 0.75 * self._long_path_ns + 0.25 * ns
        self.publish_every_ns = int(min(PUBLISH_EVERY_MAX_NS, max(LIGHT_PUBLISH_EVERY_NS, mean / LONG_PATH_SHARE)))

    def _publish_if_due(self, now_ns: int) -> None:
        """A light step's or a dark block's end publishes the run's state (W&B rows, saves) on its cadence, or from
        the step the listener asked for."""
        if now_ns >= self._publish_at or self.step >= self.publish_at_step:
            self._publish_at = now_ns + self.publish_every_ns
            self.listener.step_closed()

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

    def host_batch(self, batch: Any) -> None:
        """The DataLoader handed over a batch on the host (this thread, inside a training fetch): its mask is kept
        for the batch the framework will give :meth:`batch` on the device, whose mask could not be read there."""
        if self.closed or self.phase is None or self.phase[0] != DATA_WAIT:
            return
        try:
            self.batches.host_batch(batch)
        except Exception as error:
            self.faults.report("host_batch", error)

    def batch(self, batch: Any) -> None:
        """A micro-batch of the open step is in hand: its samples and tokens count (shapes only, no device sync)."""
        record = self.record
        if record is None or self.closed:
            return
        try:
            self.batches.count(record, batch)
        except Exception as error:
            self.faults.report("batch", error)

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

    def _end_light_wait(self) -> None:
        """The open light step's data wait ends now."""
        started = monotonic_ns()
        now = started if self._same_clock else self._step_now()
        self._light_fetch_ns += now - self._wait_from
        self._wait_from = 0
        self.phase_now = (None, now / 1e9, self.step)
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
    def aside_start(self, kind: str) -> None:
        """Evaluation or a checkpoint write starts: timed apart, out of the open step and its ``ProfilerStep``."""
        if self.closed:
            return
        if kind not in ASIDES:
            raise ValueError(f"unknown aside {kind!r}; asides are {', '.join(sorted(ASIDES))}")
        self.listener.aside_opening(kind)
        if self.dark_left:
            self._dark_to_light()
        if self.phase is not None:
            self.close_phase()
        self.end_step_label()
        if self.account.depth == 0:
            if self.record is not None:
                self._aside_mark = (kind, self.clock.mark())
            elif self.light:
                now = self._step_now()
                self._short_left = 0  # the step's end takes the long path (its aside is taken out)
                if self._wait_from:  # a wait cut short by the aside
                    self._light_fetch_ns += now - self._wait_from
                    self._wait_from = 0
                self._light_aside_from = now
        self.account.begin(kind)
        if self._nvtx_on:
            self.nvtx.push(kind)
        label = None
        if autograd_profiler._is_profiler_enabled:
            label = autograd_profiler.record_function(kind)
            label.__enter__()
        self._aside_labels.append(label)

    def aside_end(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) ends; an unmatched end is ignored."""
        if not self.account.end(kind):
            return
        self._pop_aside_annotations()
        if self.account.depth == 0 and self._light_aside_from:
            if self.light:
                self._light_aside_ns += self._step_now() - self._light_aside_from
            self._light_aside_from = 0
        if self.account.depth == 0 and self._aside_mark is not None:
            outer, start = self._aside_mark
            self._aside_mark = None
            if self.record is not None:
                self.record.intervals.append((outer, start, self.clock.mark()))

    def aside_cancel(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) was not one: it is neither counted nor timed, and what
        follows belongs to the step that opens next."""
        if not self.account.retract(kind):
            return
        self._pop_aside_annotations()
        if self.account.depth == 0:
            self._aside_mark = None
            self._light_aside_from = 0

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
