"""Light steps and detailed steps: which steps get their phases timed, and the cost budget perfhooks keeps.

Every step is counted: its start and end at the fetch, its data wait (host), the step count and the run account.
A *detailed* step also gets its phases (forward, backward, optimizer) with their device marks, its batch's tokens,
memory at phase ends and the framework's named hooks. A *light* step gets nothing more.

perfhooks meters its own time on the training thread, in place, separately for the two kinds, and the step's wall
time (one step's start to the next's). Every :data:`ADJUST_EVERY_S` (more often at first) it sets the chance that a
step is detailed to what the budget affords::

    p = (budget x step - light share x light cost) / detailed cost,   between step / DETAILED_EVERY_S and 1

Detailed steps are picked at random gaps (a seeded generator: geometric gaps of mean 1 / p), never every N-th
step, so that a loop's periodic work (logging every 50 steps, gradient accumulation, evaluation) cannot alias with
the sample. The designs this follows: Datadog's and Linux perf's profilers set their sampling rate from a budget of
their own time; JFR's and Go's samplers draw random gaps.

Always detailed (forced): the run's first :data:`WARMUP_STEPS` steps, every step of a capture window, the steps
near a memory capture, and every step while an NVTX tool is attached (its ranges are the point).

*Dark* steps are the third tier: counted and nothing else (the fetch that ends one reads the clock, no more; the
plain loop's fetch and optimizer hook end one on a small object of their own and read no clock), in blocks of
:data:`DARK_BLOCK` that a run of light steps may give way to, drawn at random (:meth:`dark_block`) where light
blocks are :data:`LIGHT_BLOCK` long. A block is timed as a whole, so the step count and the run's time stay
exact. Dark and light blocks in random order price a light step by the wall clock, where the user pays it (a light
step's Python also slows the user's forward and backward, which no meter in place sees): the mean light step just
before a dark block less the block's mean step (:meth:`dark_ended`). The detailed steps are priced the same way
against their light neighbours. Together, with perfhooks' own time at the blocks' ends and on the long path (in
place: no paired wall holds it), they give ``overhead.measured``: the share of the run perfhooks cost above a dark
step, with its 95% interval. The prices, the pairs and the report's ``overhead`` are the cost meter's
(:mod:`~perfhooks.runtime.step.cost_meter`), which every tier reports into through the sampler; the sampler reads
the prices back to govern.

The governor spends at most half the budget on light steps (the rest are dark, between :data:`MIN_DARK_SHARE` and
:data:`MAX_DARK_SHARE` of the blocks), and the other half on detailed steps, each at its price on the wall clock. A
tier not priced yet (:data:`~perfhooks.runtime.step.cost_meter.MIN_PAIRS` pairs) gets the least: dark blocks at
their most, detailed steps at their floor, one every :data:`DETAILED_EVERY_S` of steps (a time, not a count: a
sub-millisecond loop still gets four a second). The prices settle in a run's first second: the settings come a
sixteenth of :data:`ADJUST_EVERY_S` apart at first, twice as far each time.

Threading: the training thread only; :meth:`StepSampler.section` is read on it too (the report's slower parts).
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

from perfhooks.runtime.step.cost_meter import CostMeter

#: The least share of steps that are detailed: one every this many seconds of steps, whatever the budget.
DETAILED_EVERY_S = 0.25
#: Steps in a block of light steps and in a dark block (longer: its end's bookkeeping is shared by more steps), and
#: the chance that a block is dark (the governor moves it within these: 80% to 97% of the steps).
LIGHT_BLOCK, DARK_BLOCK = 16, 64
MIN_DARK_SHARE, MAX_DARK_SHARE = 0.5, 0.9
#: Steps at a run's start that are always detailed (warm-up, compilation).
WARMUP_STEPS = 50
#: Seconds of steps between two settings of the chance that a step is detailed.
ADJUST_EVERY_S = 1.0
#: The seed of the generator that draws the gaps (a run is repeatable).
SEED = 0x5EED


class StepSampler:
    """Decides, step by step, whether the next step is detailed, and keeps perfhooks' cost within ``budget``
    (a share of the step, 0..1; ``None``: every step detailed), on the prices its :class:`CostMeter` measures."""

    def __init__(self, budget: float | None, warmup_steps: int = WARMUP_STEPS,
                 adjust_every_s: float = ADJUST_EVERY_S, seed: int = SEED) -> None:
        self.budget = budget
        self.warmup_steps = warmup_steps
        #: What every step cost (the tiers report into it through the methods below).
        self.meter = CostMeter()
        self._adjust_every_ns = int(adjust_every_s * 1e9)
        #: The next setting comes this long after the last (ns): a sixteenth of ``adjust_every_s`` at first, twice as
        #: long each time (the prices settle in a run's first second).
        self._adjust_gap_ns = self._adjust_every_ns // 16
        self._random = random.Random(seed).random
        #: The chance that an unforced step is detailed (1 until the first setting).
        self.probability = 1.0
        #: Steps left until the next detailed one (1: the next step).
        self._countdown = 1
        #: The next setting of the chance, on the steps' clock (ns; 0: at the warm-up's end).
        self._adjust_at_ns = 0
        # since the last setting: the steps and their wall ns, the light and the dark ones
        self._steps = self._wall_ns = 0
        self._light_since = self._dark_since = 0
        #: ``(step, probability)`` at each change of the chance (the latest few).
        self.changes: deque[tuple[int, float]] = deque(maxlen=16)
        #: The chance that a block of light steps is dark instead (0: no dark steps; none without a budget).
        self.dark_share = MAX_DARK_SHARE if budget is not None else 0.0
        self._dark_random = random.Random(seed + 1).random  # its own: the detailed steps drawn do not move

    # the meter's figures, where the tiers and the tests read them
    detailed_steps = property(lambda self: self.meter.detailed_steps)
    light_steps = property(lambda self: self.meter.light_steps)
    dark_steps = property(lambda self: self.meter.dark_steps)
    own_ns = property(lambda self: self.meter.own_ns)
    wall_ns = property(lambda self: self.meter.wall_ns)
    _dark_pairs = property(lambda self: self.meter._dark_pairs)
    pair_open = property(lambda self: self.meter.pair_open, doc="A sampled detailed step waits for its light "
                         "neighbour after it.")

    @property
    def boundaries_ns(self) -> int:
        """perfhooks' own time at the blocks' ends and on the long path (ns; the meter's)."""
        return self.meter.boundaries_ns

    @boundaries_ns.setter
    def boundaries_ns(self, ns: int) -> None:
        self.meter.boundaries_ns = ns

    # ----------------------------------------------------------------- per step (training thread)
    def next_is_detailed(self, step: int, forced: bool) -> bool:
        """Whether the step opening now (``step``) is detailed; ``forced``: it must be (a window, memory, NVTX)."""
        if self.budget is None or step < self.warmup_steps:
            return True
        countdown = self._countdown - 1
        if countdown > 0:
            self._countdown = countdown
            return forced
        self._countdown = self._gap()
        return True

    def hold(self, probability: float) -> None:
        """Hold the chance that a step is detailed at ``probability`` (a test's or a benchmark's sample): the
        budget no longer moves it."""
        self.probability = probability
        self._countdown = self._gap()
        self._adjust_every_ns = 2**62
        self._adjust_at_ns = 2**62

    def surely_light_after(self) -> int:
        """How many steps after the one just decided are surely light (unless forced): they may be taken without
        asking, and told at once (:meth:`lights_ended`)."""
        if self.budget is None:
            return 0
        return self._countdown - 1

    def next_surely_detailed(self, step: int) -> bool:
        """Whether the step ``step`` will be detailed whatever forces it (its start may be the last step's end)."""
        return self.budget is None or step < self.warmup_steps or self._countdown <= 1

    def _gap(self) -> int:
        """Steps until the next detailed one: geometric, of mean 1 / probability."""
        p = self.probability
        if p >= 1.0:
            return 1
        if p <= 0.0:  # held at 0 (a benchmark's every step light)
            return 1 << 62
        return int(math.log(1.0 - self._random()) / math.log(1.0 - p)) + 1

    def step_ended(self, detailed: bool, own_ns: int, wall_ns: int, sampled: bool, step: int, now_ns: int,
                   captured: bool = False) -> None:
        """A step ended at ``now_ns`` (the steps' clock): ``own_ns`` of perfhooks' time on this thread, ``wall_ns``
        from its start to its end; ``sampled``: a detailed step the sampler chose (not forced by a window or a
        count), whose cost is the one a detailed step has; ``captured``: a capture window, a FLOP count or an
        allocation history forced it (its cost is the capture's, reported apart from the budget's)."""
        if not detailed:
            self.light_ended(own_ns, wall_ns, step, now_ns)
            return
        self.meter.detailed(own_ns, wall_ns, sampled, captured)
        self._wall_ns += wall_ns
        self._steps += 1
        if now_ns >= self._adjust_at_ns and self.budget is not None and step >= self.warmup_steps:
            self._adjust(step, now_ns)

    def light_ended(self, own_ns: int, wall_ns: int, step: int, now_ns: int) -> None:
        """A light step ended (see :meth:`step_ended`): the path every light step on the long path takes."""
        self.meter.light(own_ns, wall_ns)
        self._wall_ns += wall_ns
        self._steps += 1
        self._light_since += 1
        if now_ns >= self._adjust_at_ns and self.budget is not None and step >= self.warmup_steps:
            self._adjust(step, now_ns)

    def lights_ended(self, walls_ns: list[int], owns_ns: list[int], step: int, now_ns: int) -> None:
        """Light steps that ended in a row, taken without asking (at most :meth:`surely_light_after`), the last of
        them before ``step``: their wall and own ns, into the meter at once."""
        count = len(walls_ns)
        if not count:
            return
        self._countdown = max(1, self._countdown - count)
        self._wall_ns += self.meter.lights(walls_ns, owns_ns)
        self._steps += count
        self._light_since += count
        if now_ns >= self._adjust_at_ns and self.budget is not None and step - 1 >= self.warmup_steps:
            self._adjust(step - 1, now_ns)

    def dark_block(self, surely_light: int) -> int:
        """How many of the next steps, all ``surely_light``, are dark: a block of :data:`DARK_BLOCK` (fewer where
        fewer are surely light, :data:`LIGHT_BLOCK` at least) with chance :attr:`dark_share`, else 0 (they stay
        light)."""
        if surely_light <= LIGHT_BLOCK or self.dark_share <= 0.0:
            return 0
        # a light step is left before the next detailed step: its neighbour before it, for its pair
        return min(DARK_BLOCK, surely_light - 1) if self._dark_random() < self.dark_share else 0

    def dark_ended(self, steps: int, wall_ns: int, light_before_ns: list[int], step: int, now_ns: int) -> None:
        """A dark block of ``steps`` ended at ``now_ns`` after ``wall_ns``; ``light_before_ns``: the walls of the light
        steps just before it (they price a light step against it, in the meter)."""
        self._countdown = max(1, self._countdown - steps)
        self.meter.dark(steps, wall_ns, light_before_ns)
        self._wall_ns += wall_ns
        self._steps += steps
        self._dark_since += steps
        if now_ns >= self._adjust_at_ns and self.budget is not None and step >= self.warmup_steps:
            self._adjust(step, now_ns)

    # ----------------------------------------------------------------- the budget
    def _adjust(self, step: int, now_ns: int) -> None:
        self.adjust(step)
        self._adjust_at_ns = now_ns + self._adjust_gap_ns
        self._adjust_gap_ns = min(self._adjust_every_ns, 2 * self._adjust_gap_ns)

    def adjust(self, step: int) -> None:
        """Set the chance that a step is detailed, and that a block is dark, from each tier's price on the wall
        clock (the meter's) and the mean step since the last setting. A tier not priced yet is spent on as little
        as it may be: detailed steps at their floor, dark blocks at their most."""
        detailed, light = self.meter.medians()
        if self._steps and self._wall_ns > 0 and self.budget is not None and detailed is not None:
            step_ns = self._wall_ns / self._steps
            floor = min(1.0, step_ns / (DETAILED_EVERY_S * 1e9))
            light_over_dark, detailed_over_light = self.meter.measured_means()
            light = light or 0.0
            light_cost = light if light_over_dark is None else max(0.0, light_over_dark)
            if self.dark_share > 0.0 and light_over_dark is not None:  # light steps: at most half the budget
                wanted = 0.5 * self.budget * step_ns / light_cost if light_cost > 0 else 1.0
                self.dark_share = min(MAX_DARK_SHARE, max(MIN_DARK_SHARE, _dark_blocks(wanted)))
            # the light steps' share as it is (a loop whose steps cannot be dark has no dark block)
            light_share = max(_light_steps(self.dark_share), self._light_share_now())
            p = floor
            if detailed_over_light is not None:
                extra = max(detailed - light, detailed_over_light)
                allowed = self.budget * step_ns - light_share * light_cost
                p = 1.0 if extra <= 0 else min(1.0, max(floor, allowed / extra))
            if abs(p - self.probability) > 0.05 * self.probability:
                self.changes.append((step, round(p, 4)))
                self.probability = p
                self._countdown = min(self._countdown, self._gap())
        self._steps = self._wall_ns = 0
        self._light_since = self._dark_since = 0

    def _light_share_now(self) -> float:
        """Of the light and dark steps since the last setting, the light ones' share (0 with none)."""
        steps = self._light_since + self._dark_since
        return self._light_since / steps if steps else 0.0

    def live_share(self) -> float:
        """What perfhooks costs the steps now (``top``'s figure; the meter's)."""
        return self.meter.live_share()

    # ----------------------------------------------------------------- the report
    def section(self) -> dict[str, Any]:
        """The report's ``overhead`` section (docs/report.md; the meter's, with the governor's settings)."""
        return self.meter.section(self.budget, self.probability, self.dark_share, list(self.changes))

    def measured(self, in_place: float) -> dict[str, Any]:
        """``overhead.measured`` (the meter's :meth:`CostMeter.measured`)."""
        return self.meter.measured(in_place)


def _dark_blocks(light_steps: float) -> float:
    """The chance that a block is dark for ``light_steps`` of the steps to be light (blocks of unequal lengths)."""
    light_steps = min(1.0, max(0.0, light_steps))
    light = LIGHT_BLOCK * (1.0 - light_steps)
    return light / (light + DARK_BLOCK * light_steps) if light > 0 else 0.0


def _light_steps(dark_blocks: float) -> float:
    """The share of steps that are light when a block is dark with chance ``dark_blocks``."""
    light = LIGHT_BLOCK * (1.0 - dark_blocks)
    return light / (light + DARK_BLOCK * dark_blocks)
