"""Light steps and detailed steps: which steps get their phases timed, and the cost budget perfhooks keeps.

Every step is counted: its start and end at the fetch, its data wait (host), the step count and the run account.
A *detailed* step also gets its phases (forward, backward, optimizer) with their device marks, its batch's tokens,
memory at phase ends and the framework's named hooks. A *light* step gets nothing more.

perfhooks meters its own time on the training thread, in place, separately for the two kinds, and the step's wall
time (one step's start to the next's). Every :data:`ADJUST_EVERY_S` it sets the chance that a step is detailed to
what the budget affords::

    p = (budget x step - light cost) / (detailed cost - light cost),   between 1 / MAX_GAP and 1

Detailed steps are picked at random gaps (a seeded generator: geometric gaps of mean 1 / p), never every N-th
step, so that a loop's periodic work (logging every 50 steps, gradient accumulation, evaluation) cannot alias with
the sample. The designs this follows: Datadog's and Linux perf's profilers set their sampling rate from a budget of
their own time; JFR's and Go's samplers draw random gaps.

Always detailed (forced): the run's first :data:`WARMUP_STEPS` steps, every step of a capture window, the steps
near a memory capture, and every step while an NVTX tool is attached (its ranges are the point).

Threading: the training thread only; :meth:`StepSampler.section` is read on it too (the report's slower parts).
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

#: The least share of steps that are detailed: about 1 step in this many, whatever the budget.
MAX_GAP = 64
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
        self._random = random.Random(seed).random
        #: The chance that an unforced step is detailed (1 until the first setting).
        self.probability = 1.0
        #: Steps left until the next detailed one (1: the next step).
        self._countdown = 1
        #: The next setting of the chance, on the steps' clock (ns; 0: at the warm-up's end).
        self._adjust_at_ns = 0
        #: The last setting had no light step to price: the next comes after a sixteenth of the interval.
        self._adjust_soon = False
        # since the last setting: the steps and their wall ns
        self._steps = self._wall_ns = 0
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
        self.light_steps += count
        self._light_recent.extend(owns_ns)
        if self._held is not None:
            self._close_pair(walls_ns[0])
        self._light_before = walls_ns[-1]
        if now_ns >= self._adjust_at_ns and self.budget is not None and step - 1 >= self.warmup_steps:
            self._adjust(step - 1, now_ns)

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
        self._adjust_soon = False
        self.adjust(step)
        self._adjust_at_ns = now_ns + (self._adjust_every_ns // 16 if self._adjust_soon else self._adjust_every_ns)

    def adjust(self, step: int) -> None:
        """Set the chance that a step is detailed from each kind's median cost (the latest
        :data:`KEPT_STEPS` of each) and the mean step since the last setting."""
        detailed, light = _median(self._detailed_recent), _median(self._light_recent)
        if light is None:  # no light step priced yet (the warm-up's end): set again soon, once some are
            self._adjust_soon = True
            light = 0.0
        if self._steps and self._wall_ns > 0 and self.budget is not None and detailed is not None:
            step_ns = self._wall_ns / self._steps
            extra = detailed - light
            allowed = self.budget * step_ns - light
            p = 1.0 if extra <= 0 else allowed / extra
            p = min(1.0, max(1.0 / MAX_GAP, p))
            if abs(p - self.probability) > 0.05 * self.probability:
                self.changes.append((step, round(p, 4)))
                self.probability = p
                self._countdown = min(self._countdown, self._gap())
        self._steps = self._wall_ns = 0

    # ----------------------------------------------------------------- the report
    def section(self) -> dict[str, Any]:
        """The report's ``overhead`` section (docs/report.md)."""
        steps = self.detailed_steps + self.light_steps
        share = (self.own_ns - self.captures_ns) / self.wall_ns if self.wall_ns > 0 else 0.0
        captures = self.captures_ns / self.wall_ns if self.wall_ns > 0 else 0.0
        paired = None
        if self._pairs >= MIN_PAIRS:
            mean = self._pair_sum / self._pairs
            variance = max(0.0, (self._pair_squares - self._pairs * mean * mean) / (self._pairs - 1))
            half = 1.96 * math.sqrt(variance / self._pairs)
            paired = {"pairs": self._pairs, "mean_us": round(mean / 1e3, 3),
                      "low_us": round((mean - half) / 1e3, 3), "high_us": round((mean + half) / 1e3, 3)}
        return {
            "budget": self.budget,
            "detailed_steps": self.detailed_steps,
            "light_steps": self.light_steps,
            "detailed_share": round(self.detailed_steps / steps, 6) if steps else 0.0,
            "probability": round(self.probability, 6),
            "changes": [{"step": step, "probability": p} for step, p in self.changes],
            "in_place_us": {"detailed": _median_us(self._detailed_recent), "light": _median_us(self._light_recent)},
            "share_of_run": round(share, 6),
            "captures_share": round(captures, 6),
            "kept": None if self.budget is None else share <= self.budget,
            "paired": paired,
        }


def _median(values: deque[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])


def _median_us(values: deque[int]) -> float | None:
    median = _median(values)
    return None if median is None else round(median / 1e3, 3)
