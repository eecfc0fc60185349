"""What perfhooks costs the steps, in one place: every tier reports its steps here (a detailed step, light steps,
a dark block, the long path's own time), and this module alone turns them into prices, pairs, intervals and the
report's ``overhead`` section, the capture windows' price included (:func:`windows_cost`).

- **In place**: perfhooks' own time on the training thread, per kind of step (the medians of the latest
  :data:`KEPT_STEPS`), over the steps' wall time; the steps a capture forced are counted apart (``captures_ns``).
- **On the wall clock, paired**: a light step's wall time less the mean step of the dark block after it (the
  light steps' price above a dark step); a sampled detailed step's wall time less the mean of its two light
  neighbours' (a detailed step's price above a light one). Each is a mean with its 95% interval once it has
  :data:`MIN_PAIRS` pairs.
- **Measured**: those prices times each kind's steps, plus the long path's and the blocks' ends' own time (in place:
  no paired wall holds it), over the steps' wall time, with its 95% interval: ``overhead.measured``.
- **Windows**: the steps a capture window or perfhooks' other work overlapped, priced against the steady steps'
  median on the wall clock.

The governor (:class:`~perfhooks.runtime.step.sampling.StepSampler`) reads the prices back to set how many steps are
detailed and how many blocks dark. Threading: the training thread only (the report's section is read there too).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

#: Per-step own times kept for each kind's median (the most recent).
KEPT_STEPS = 512
#: Pairs (a detailed step and its light neighbours; a light block and a dark one) needed before their difference is
#: reported.
MIN_PAIRS = 10
#: The measured share is resolved (``kept`` is judged on it) once its 95% interval is within this of it.
RESOLVED_WITHIN = 0.005
#: A light block's steps needed before the dark block after it prices a light step against it.
LIGHT_NEIGHBOURS = 8


class CostMeter:
    """perfhooks' cost on the steps of one run: what each tier reports, and the prices and shares from it."""

    def __init__(self) -> None:
        self.detailed_steps = self.light_steps = self.dark_steps = 0
        #: perfhooks' own time on the training thread, and the steps' wall time (ns, the whole run).
        self.own_ns = self.wall_ns = 0
        #: Of ``own_ns``, the steps that a capture window, a FLOP count or an allocation history forced.
        self.captures_ns = 0
        #: perfhooks' own time at the blocks' ends and on the long path (ns, in place): no paired wall holds it (the
        #: step after a boundary is left out of the pairs), so the measured share adds it at this price, a lower bound.
        self.boundaries_ns = 0
        #: Own ns of the latest sampled detailed steps and light steps (each kind's median prices the budget).
        self.detailed_recent: deque[int] = deque(maxlen=KEPT_STEPS)
        self.light_recent: deque[int] = deque(maxlen=KEPT_STEPS)
        # the paired difference: a sampled detailed step against its light neighbours (ns; n, sum, sum of squares)
        self._light_before = -1  # the wall ns of the last step ended, when it was light (else -1)
        self._held: tuple[int, int] | None = None  # (detailed wall, light wall before it), waiting for its next
        self._pairs = 0
        self._pair_sum = self._pair_squares = 0.0
        #: A light step against the dark block after it (ns a step; n, sum, sum of squares).
        self._dark_pairs = 0
        self._dark_sum = self._dark_squares = 0.0

    # ----------------------------------------------------------------- what the tiers report
    def detailed(self, own_ns: int, wall_ns: int, sampled: bool, captured: bool) -> None:
        """A detailed step ended: ``own_ns`` of perfhooks' time, ``wall_ns`` from its start to its end; ``sampled``:
        drawn (its cost is a detailed step's), not forced; ``captured``: a capture forced it (its cost is apart)."""
        if captured:
            self.captures_ns += own_ns
        self.own_ns += own_ns
        self.wall_ns += wall_ns
        self.detailed_steps += 1
        self._held = None
        if sampled:
            self.detailed_recent.append(own_ns)
            if self._light_before >= 0:  # paired with the light steps either side of it
                self._held = (wall_ns, self._light_before)
        self._light_before = -1

    def light(self, own_ns: int, wall_ns: int) -> None:
        """A light step ended (the path every light step on the long path takes, kept short)."""
        self.own_ns += own_ns
        self.wall_ns += wall_ns
        self.light_steps += 1
        self.light_recent.append(own_ns)
        if self._held is not None:  # the light step after a sampled detailed one: the pair is complete
            self._close_pair(wall_ns)
        self._light_before = wall_ns

    def lights(self, walls_ns: list[int], owns_ns: list[int]) -> int:
        """Light steps that ended in a row (the short path's, folded): their wall and own ns; their wall ns in all."""
        wall_ns = sum(walls_ns)
        self.own_ns += sum(owns_ns)
        self.wall_ns += wall_ns
        self.light_steps += len(walls_ns)
        self.light_recent.extend(owns_ns)
        if self._held is not None:
            self._close_pair(walls_ns[0])
        self._light_before = walls_ns[-1]
        return wall_ns

    def dark(self, steps: int, wall_ns: int, light_before_ns: list[int]) -> None:
        """A dark block of ``steps`` ended after ``wall_ns``; ``light_before_ns``: the walls of the light steps just
        before it (:data:`LIGHT_NEIGHBOURS` or more price a light step against it)."""
        self.dark_steps += steps
        self.wall_ns += wall_ns
        self._held = None  # a detailed step's pair needs a light step after it
        self._light_before = -1
        if steps and len(light_before_ns) >= LIGHT_NEIGHBOURS:
            difference = sum(light_before_ns) / len(light_before_ns) - wall_ns / steps
            self._dark_pairs += 1
            self._dark_sum += difference
            self._dark_squares += difference * difference

    @property
    def pair_open(self) -> bool:
        """A sampled detailed step waits for the light step after it (its pair closes with that step's wall)."""
        return self._held is not None

    def _close_pair(self, after_ns: int) -> None:
        """The light step after a held detailed one ended in ``after_ns``: the detailed step's wall time less the
        mean of its two light neighbours' goes into the paired figure."""
        detailed, before = self._held  # type: ignore[misc]
        self._held = None
        difference = detailed - (before + after_ns) / 2.0
        self._pairs += 1
        self._pair_sum += difference
        self._pair_squares += difference * difference

    # ----------------------------------------------------------------- prices
    def medians(self) -> tuple[float | None, float | None]:
        """The own ns of a sampled detailed step and of a light step, in place (their medians)."""
        return _median(self.detailed_recent), _median(self.light_recent)

    def measured_means(self) -> tuple[float | None, float | None]:
        """A light step's wall ns over a dark one's, and a detailed step's over a light one's, each once it has
        :data:`MIN_PAIRS` pairs (else ``None``)."""
        light = self._dark_sum / self._dark_pairs if self._dark_pairs >= MIN_PAIRS else None
        detailed = self._pair_sum / self._pairs if self._pairs >= MIN_PAIRS else None
        return light, detailed

    def in_place_share(self) -> float:
        """perfhooks' own time on the training thread over the steps' wall time, the captures' left out."""
        return (self.own_ns - self.captures_ns) / self.wall_ns if self.wall_ns > 0 else 0.0

    def live_share(self) -> float:
        """What perfhooks costs the steps now (``top``'s figure): the measured share once resolved, else its own time
        in place (a lower bound), the captures left out of both."""
        in_place = self.in_place_share()
        if self._dark_pairs < MIN_PAIRS:
            return in_place
        measured = self.measured(in_place)
        return measured["share"] if measured["resolved"] else in_place

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
            extra = (_median(self.detailed_recent) or 0.0) - (_median(self.light_recent) or 0.0)
            cost += self.detailed_steps * max(0.0, extra) / 1e3
        share, half = cost / wall_us, 1.96 * math.sqrt(variance) / wall_us
        out.update(share=round(share, 6), low=round(share - half, 6), high=round(share + half, 6),
                   resolved=half <= RESOLVED_WITHIN and (detailed is not None or not self.detailed_steps))
        return out

    # ----------------------------------------------------------------- the report
    def section(self, budget: float | None, probability: float, dark_share: float,
                changes: list[tuple[int, float]]) -> dict[str, Any]:
        """The report's ``overhead`` section (docs/report.md), with the governor's settings (``budget``, the chance
        a step is detailed, a block dark, and its latest changes)."""
        steps = self.detailed_steps + self.light_steps + self.dark_steps
        share = self.in_place_share()
        captures = self.captures_ns / self.wall_ns if self.wall_ns > 0 else 0.0
        measured = self.measured(share)
        kept = None
        if budget is not None:
            kept = measured["share"] <= budget if measured["resolved"] else share <= budget
        return {
            "budget": budget,
            "detailed_steps": self.detailed_steps,
            "light_steps": self.light_steps,
            "dark_steps": self.dark_steps,
            "detailed_share": round(self.detailed_steps / steps, 6) if steps else 0.0,
            "probability": round(probability, 6),
            "dark_share": round(dark_share, 6),
            "changes": [{"step": step, "probability": p} for step, p in changes],
            "in_place_us": {"detailed": _median_us(self.detailed_recent), "light": _median_us(self.light_recent)},
            "share_of_run": round(share, 6),
            "captures_share": round(captures, 6),
            "kept": kept,
            "kept_on": "measured" if measured["resolved"] else "in_place",
            "paired": _paired_us(self._pairs, self._pair_sum, self._pair_squares),
            "measured": measured,
        }


def overhead_section(overhead: dict[str, Any], sampled_steps: int) -> dict[str, Any]:
    """The report's ``overhead`` from a published :meth:`CostMeter.section` (a copy of its own, any thread),
    ``detailed_steps`` as the statistics counted them (the steps resolved so far)."""
    section = dict(overhead)
    section["in_place_us"] = dict(section["in_place_us"])
    section["changes"] = [dict(change) for change in section["changes"]]
    measured = section.get("measured")
    if measured is not None:
        section["measured"] = {key: dict(value) if isinstance(value, dict) else value
                               for key, value in measured.items()}
    if section.get("paired") is not None:
        section["paired"] = dict(section["paired"])
    section["sampled_steps"] = sampled_steps
    return section


def windows_cost(windows: list[dict[str, Any]], stats: Any) -> dict[str, Any]:
    """``overhead.windows``: the capture windows' count, the most RSS one added (bytes, its steps or its export's),
    how many stopped early at their memory bound, and what the steps that overlapped them or perfhooks' other own
    work (a trace's export and analysis, a memory capture) took beyond a steady step's median, priced against their
    neighbours on the wall clock: ``steps``, ``added_s`` and ``time_share`` (of the steps' time)."""
    added = [max(w.get("peak_rss_added_bytes") or 0, w.get("export_peak_rss_added_bytes") or 0) for w in windows]
    steady = stats.steady_step
    typical = steady.quantile(0.5) if steady.count else 0.0
    added_ms = max(0.0, stats.own_ms - stats.own_steps * typical) if typical > 0 else 0.0
    training = stats.training_ms
    return {"count": len(windows), "peak_rss_added_bytes": max(added, default=0),
            "stopped_early": sum(1 for w in windows if w.get("stopped_early")), "steps": stats.own_steps,
            "added_s": round(added_ms / 1e3, 6), "time_share": round(added_ms / training, 6) if training > 0 else 0.0}


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
