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
step, with its 95% interval.

The governor spends at most half the budget on light steps (the rest are dark, between :data:`MIN_DARK_SHARE` and
:data:`MAX_DARK_SHARE` of the blocks), and the other half on detailed steps, each at its price on the wall clock. A
tier not priced yet (:data:`MIN_PAIRS` pairs) gets the least: dark blocks at their most, detailed steps at their
floor, one every :data:`DETAILED_EVERY_S` of steps (a time, not a count: a sub-millisecond loop still gets four a
second). The prices settle in a run's first second: the settings come a sixteenth of :data:`ADJUST_EVERY_S` apart at
first, twice as far each time.

Threading: the training thread only; :meth:`StepSampler.section` is read on it too (the report's slower parts).
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

#: The least share of steps that are detailed: one every this many seconds of steps, whatever the budget.
DETAILED_EVERY_S = 0.25
#: Steps in a block of light steps and in a dark block (longer: its end's bookkeeping is shared by more steps), and
#: the chance that a block is dark (the governor moves it within these: 80% to 97% of the steps).
LIGHT_BLOCK, DARK_BLOCK = 16, 64
MIN_DARK_SHARE, MAX_DARK_SHARE = 0.5, 0.9
#: The measured share is resolved (``kept`` is judged on it) once its 95% interval is within this of it.
RESOLVED_WITHIN = 0.005
#: Steps at a run's start that are always detailed (warm-up, compilation).
WARMUP_STEPS = 50
#: Seconds of steps between two settings of the chance that a step is detailed.
ADJUST_EVERY_S = 1.0
#: Per-step own times kept for each kind's median (the most recent).
KEPT_STEPS = 512
#: Pairs (a detailed step and its light neighbours) needed before their difference is reported.
MIN_PAIRS = 10
#: The seed of the generator that draws the gaps (a run is repeatable).
SEED = 0x5EED


class StepSampler:
    """Decides, step by step, whether the next step is detailed, and keeps perfhooks' cost within ``budget``
    (a share of the step, 0..1; ``None``: every step detailed)."""

    def __init__(self, budget: float | None, warmup_steps: int = WARMUP_STEPS,
                 adjust_every_s: float = ADJUST_EVERY_S, seed: int = SEED) -> None:
        self.budget = budget
        self.warmup_steps = warmup_steps
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
        # over the whole run
        self.detailed_steps = self.light_steps = 0
        self.own_ns = self.wall_ns = 0
        #: Of ``own_ns``, the steps that a capture window, a FLOP count or an allocation history forced.
        self.captures_ns = 0
        #: Own ns of the latest sampled detailed steps and light steps (each kind's median prices the budget).
        self._detailed_recent: deque[int] = deque(maxlen=KEPT_STEPS)
        self._light_recent: deque[int] = deque(maxlen=KEPT_STEPS)
        #: ``(step, probability)`` at each change of the chance (the latest few).
        self.changes: deque[tuple[int, float]] = deque(maxlen=16)
        # the paired difference: a sampled detailed step against its light neighbours (ns; n, sum, sum of squares)
        self._light_before = -1  # the wall ns of the last step ended, when it was light (else -1)
        self._held: tuple[int, int] | None = None  # (detailed wall, light wall before it), waiting for its next
        self._pairs = 0
        self._pair_sum = self._pair_squares = 0.0
        #: The chance that a block of light steps is dark instead (0: no dark steps; none without a budget).
        self.dark_share = MAX_DARK_SHARE if budget is not None else 0.0
        self._dark_random = random.Random(seed + 1).random  # its own: the detailed steps drawn do not move
        self.dark_steps = 0
        #: perfhooks' own time at the blocks' ends and on the long path (ns, in place): no paired wall holds it (the
        #: step after a boundary is left out of the pairs), so the measured share adds it at this price, a lower bound.
        self.boundaries_ns = 0
        #: A light step against the dark block after it (ns a step; n, sum, sum of squares).
        self._dark_pairs = 0
        self._dark_sum = self._dark_squares = 0.0

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
        if captured:
            self.captures_ns += own_ns
        self.own_ns += own_ns
        self.wall_ns += wall_ns
        self._wall_ns += wall_ns
        self._steps += 1
        self.detailed_steps += 1
        self._held = None
        if sampled:
            self._detailed_recent.append(own_ns)
            if self._light_before >= 0:  # paired with the light steps either side of it
                self._held = (wall_ns, self._light_before)
        self._light_before = -1
        if now_ns >= self._adjust_at_ns and self.budget is not None and step >= self.warmup_steps:
            self._adjust(step, now_ns)

    def light_ended(self, own_ns: int, wall_ns: int, step: int, now_ns: int) -> None:
        """A light step ended (see :meth:`step_ended`): the path every light step takes, kept short."""
        self.own_ns += own_ns
        self.wall_ns += wall_ns
        self._wall_ns += wall_ns
        self._steps += 1
        self._light_since += 1
        self.light_steps += 1
        self._light_recent.append(own_ns)
        if self._held is not None:  # the light step after a sampled detailed one: the pair is complete
            self._close_pair(wall_ns)
        self._light_before = wall_ns
        if now_ns >= self._adjust_at_ns and self.budget is not None and step >= self.warmup_steps:
            self._adjust(step, now_ns)

    def lights_ended(self, walls_ns: list[int], owns_ns: list[int], step: int, now_ns: int) -> None:
        """Light steps that ended in a row, taken without asking (at most :meth:`surely_light_after`), the last of
        them before ``step``: their wall and own ns; :meth:`light_ended` for each, at once."""
        count = len(walls_ns)
        if not count:
            return
        self._countdown = max(1, self._countdown - count)
        wall_ns = sum(walls_ns)
        self.own_ns += sum(owns_ns)
        self.wall_ns += wall_ns
        self._wall_ns += wall_ns
        self._steps += count
        self._light_since += count
        self.light_steps += count
        self._light_recent.extend(owns_ns)
        if self._held is not None:
            self._close_pair(walls_ns[0])
        self._light_before = walls_ns[-1]
        if now_ns >= self._adjust_at_ns and self.budget is not None and step - 1 >= self.warmup_steps:
            self._adjust(step - 1, now_ns)

    @property
    def pair_open(self) -> bool:
        """A sampled detailed step waits for the light step after it (its pair closes with that step's wall)."""
        return self._held is not None

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
        steps just before it (a mean of :data:`LIGHT_BLOCK` // 2 or more prices a light step against it)."""
        self._countdown = max(1, self._countdown - steps)
        self.dark_steps += steps
        self.wall_ns += wall_ns
        self._wall_ns += wall_ns
        self._steps += steps
        self._dark_since += steps
        self._held = None  # a detailed step's pair needs a light step after it
        self._light_before = -1
        if steps and len(light_before_ns) >= LIGHT_BLOCK // 2:
            difference = sum(light_before_ns) / len(light_before_ns) - wall_ns / steps
            self._dark_pairs += 1
            self._dark_sum += difference
            self._dark_squares += difference * difference
        if now_ns >= self._adjust_at_ns and self.budget is not None and step >= self.warmup_steps:
            self._adjust(step, now_ns)

    def _close_pair(self, after_ns: int) -> None:
        """The light step after a held detailed one ended in ``after_ns``: the detailed step's wall time less the
        mean of its two light neighbours' goes into the paired figure."""
        detailed, before = self._held  # type: ignore[misc]
        self._held = None
        difference = detailed - (before + after_ns) / 2.0
        self._pairs += 1
        self._pair_sum += difference
        self._pair_squares += difference * difference

    # ----------------------------------------------------------------- the budget
    def _adjust(self, step: int, now_ns: int) -> None:
        self.adjust(step)
        self._adjust_at_ns = now_ns + self._adjust_gap_ns
        self._adjust_gap_ns = min(self._adjust_every_ns, 2 * self._adjust_gap_ns)

    def adjust(self, step: int) -> None:
        """Set the chance that a step is detailed, and that a block is dark, from each tier's price on the wall
        clock (:meth:`_measured_means`) and the mean step since the last setting. A tier not priced yet is spent
        on as little as it may be: detailed steps at their floor, dark blocks at their most."""
        detailed, light = _median(self._detailed_recent), _median(self._light_recent)
        if self._steps and self._wall_ns > 0 and self.budget is not None and detailed is not None:
            step_ns = self._wall_ns / self._steps
            floor = min(1.0, step_ns / (DETAILED_EVERY_S * 1e9))
            light_over_dark, detailed_over_light = self._measured_means()
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
        """What perfhooks costs the steps now (``top``'s figure): the measured share once resolved, else its own time
        in place (a lower bound), the captures left out of both."""
        in_place = self._in_place_share()
        if self._dark_pairs < MIN_PAIRS:
            return in_place
        measured = self.measured(in_place)
        return measured["share"] if measured["resolved"] else in_place

    def _in_place_share(self) -> float:
        """perfhooks' own time on the training thread over the steps' wall time, the captures' left out."""
        return (self.own_ns - self.captures_ns) / self.wall_ns if self.wall_ns > 0 else 0.0

    def _measured_means(self) -> tuple[float | None, float | None]:
        """A light step's wall ns over a dark one's, and a detailed step's over a light one's, each once it has
        :data:`MIN_PAIRS` pairs (else ``None``)."""
        light = self._dark_sum / self._dark_pairs if self._dark_pairs >= MIN_PAIRS else None
        detailed = self._pair_sum / self._pairs if self._pairs >= MIN_PAIRS else None
        return light, detailed

    # ----------------------------------------------------------------- the report
    def section(self) -> dict[str, Any]:
        """The report's ``overhead`` section (docs/report.md)."""
        steps = self.detailed_steps + self.light_steps + self.dark_steps
        share = self._in_place_share()
        captures = self.captures_ns / self.wall_ns if self.wall_ns > 0 else 0.0
        measured = self.measured(share)
        kept = None
        if self.budget is not None:
            kept = measured["share"] <= self.budget if measured["resolved"] else share <= self.budget
        return {
            "budget": self.budget,
            "detailed_steps": self.detailed_steps,
            "light_steps": self.light_steps,
            "dark_steps": self.dark_steps,
            "detailed_share": round(self.detailed_steps / steps, 6) if steps else 0.0,
            "probability": round(self.probability, 6),
            "dark_share": round(self.dark_share, 6),
            "changes": [{"step": step, "probability": p} for step, p in self.changes],
            "in_place_us": {"detailed": _median_us(self._detailed_recent), "light": _median_us(self._light_recent)},
            "share_of_run": round(share, 6),
            "captures_share": round(captures, 6),
            "kept": kept,
            "kept_on": "measured" if measured["resolved"] else "in_place",
            "paired": _paired_us(self._pairs, self._pair_sum, self._pair_squares),
            "measured": measured,
        }

    def measured(self, in_place: float) -> dict[str, Any]:
        """``overhead.measured``: the share of the steps' wall time perfhooks cost above a dark step, from the paired
        prices (a light step over the dark block after it, a detailed step over its light neighbours) times the
        steps of each kind, with its 95% interval; ``resolved`` once the interval is within
        :data:`RESOLVED_WITHIN` of it. Until then ``share`` is the in-place figure, a lower bound."""
        light = _paired_us(self._dark_pairs, self._dark_sum, self._dark_squares)
        detailed = _paired_us(self._pairs, self._pair_sum, self._pair_squares)
        wall_us = self.wall_ns / 1e3
        boundaries = self.boundaries_ns / 1e3 / wall_us if wall_us > 0 else 0.0
        out: dict[str, Any] = {"share": round(in_place, 6), "low": None, "high": None, "resolved": False,
                               "light_over_dark": light, "detailed_over_light": detailed,
                               "boundaries_share": round(boundaries, 6)}
        if wall_us <= 0 or light is None:
            return out
        above_dark = self.light_steps + self.detailed_steps  # each pays a light step's price over a dark one
        cost = above_dark * light["mean_us"] + self.boundaries_ns / 1e3
        variance = (above_dark * light["half_us"] / 1.96) ** 2
        if detailed is not None:
            cost += self.detailed_steps * detailed["mean_us"]
            variance += (self.detailed_steps * detailed["half_us"] / 1.96) ** 2
        elif self.detailed_steps:  # not priced yet: at its price in place, a lower bound (unresolved)
            extra = (_median(self._detailed_recent) or 0.0) - (_median(self._light_recent) or 0.0)
            cost += self.detailed_steps * max(0.0, extra) / 1e3
        share, half = cost / wall_us, 1.96 * math.sqrt(variance) / wall_us
        out.update(share=round(share, 6), low=round(share - half, 6), high=round(share + half, 6),
                   resolved=half <= RESOLVED_WITHIN and (detailed is not None or not self.detailed_steps))
        return out


def _dark_blocks(light_steps: float) -> float:
    """The chance that a block is dark for ``light_steps`` of the steps to be light (blocks of unequal lengths)."""
    light_steps = min(1.0, max(0.0, light_steps))
    light = LIGHT_BLOCK * (1.0 - light_steps)
    return light / (light + DARK_BLOCK * light_steps) if light > 0 else 0.0


def _light_steps(dark_blocks: float) -> float:
    """The share of steps that are light when a block is dark with chance ``dark_blocks``."""
    light = LIGHT_BLOCK * (1.0 - dark_blocks)
    return light / (light + DARK_BLOCK * dark_blocks)


def _paired_us(pairs: int, total: float, squares: float) -> dict[str, Any] | None:
    """A paired difference's mean and 95% interval (µs) from its ns sums, once it has :data:`MIN_PAIRS` pairs."""
    if pairs < MIN_PAIRS:
        return None
    mean = total / pairs
    variance = max(0.0, (squares - pairs * mean * mean) / (pairs - 1))
    half = 1.96 * math.sqrt(variance / pairs)
    return {"pairs": pairs, "mean_us": round(mean / 1e3, 3), "low_us": round((mean - half) / 1e3, 3),
            "high_us": round((mean + half) / 1e3, 3), "half_us": round(half / 1e3, 3)}


def _median(values: deque[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])


def _median_us(values: deque[int]) -> float | None:
    median = _median(values)
    return None if median is None else round(median / 1e3, 3)
