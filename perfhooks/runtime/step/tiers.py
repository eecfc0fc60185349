"""The tiers of a step, and the light and dark ones' state machine (a part of
:class:`~perfhooks.runtime.step.tracker.StepTracker`).

Three tiers, drawn by the :class:`~perfhooks.runtime.step.sampling.StepSampler` at each step's opening:

- **detailed**: its phases get device marks, its batch is counted, the listener hears its phases (the tracker's own
  methods);
- **light**: its start, its end and its data wait, on the host clock; nothing else;
- **dark**: counted, nothing else: a block of steps whose wall time is read at its two ends.

The transitions, all here but the first:

==========================================  ==============================================================
from                                        to
==========================================  ==============================================================
a step opens (``open_step``)                detailed or light, as the sampler draws (forced detailed by a
                                            window, a FLOP count, NVTX)
a light step's end, surely light after it   the next light step, on the short path (:meth:`_short_fetch`:
                                            three appends; folded later by :meth:`_fold_short`)
every :data:`~perfhooks.runtime.step.       a dark block, at random (:meth:`_maybe_dark`), where its steps
sampling.LIGHT_BLOCK` light steps           fit before the next publication
a dark block's last step (``fetch``)        light on the short path, or the long path's opening
                                            (:meth:`_end_dark`)
an aside, a second fetch, the loader's end,  light, from the block's last step end (:meth:`_dark_to_light`)
compilation, ``step_end``, the close
a light step on the long path               its figures into the statistics (:meth:`_end_light`), then the
                                            next step's draw
==========================================  ==============================================================

Each tier reports what it cost to the sampler's meter (``light_ended``, ``lights_ended``, ``dark_ended``,
``step_ended``). A plain loop's dark steps may end on its own fast path (:class:`DarkFetches`).
"""

from __future__ import annotations

from typing import Any

from perfhooks.events import DATA_WAIT
from perfhooks.report.statistics import UNTIMED_FETCH
from perfhooks.runtime.step.publication import LIGHT_PUBLISH_EVERY_NS
from perfhooks.runtime.step.sampling import LIGHT_BLOCK
from perfhooks.timebase import monotonic_ns

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


class LightAndDarkSteps:
    """The light and dark tiers (a mixin of :class:`~perfhooks.runtime.step.tracker.StepTracker`, whose state
    they share: :meth:`_init_light_steps` sets it)."""

    listener: Any
    sampler: Any
    stats: Any
    pending: Any
    faults: Any
    step: int
    global_step: int
    naming: bool
    unnamed_steps: int
    closed: bool
    quiet_until_ns: int
    phase_now: tuple[str | None, float | None, int]
    _own_ns: int
    _same_clock: bool
    _step_now: Any
    open_step: Any
    _phase_start: Any
    _publish_if_due: Any
    _long_path_took: Any

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

    def light_compiled_now(self) -> None:
        """torch.compile compiled in the open light step: it is not steady, and it ends on the long path."""
        if self.dark_left:
            self._dark_to_light()
        self.light_compiled = True
        self._short_left = 0

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

    def _end_light_wait(self) -> None:
        """The open light step's data wait ends now."""
        started = monotonic_ns()
        now = started if self._same_clock else self._step_now()
        self._light_fetch_ns += now - self._wait_from
        self._wait_from = 0
        self.phase_now = (None, now / 1e9, self.step)
        self._own_ns += monotonic_ns() - started
