"""Step statistics in bounded memory: streaming summaries (exact count, mean, max; exact quantiles up to
:data:`EXACT_VALUES` values, within 1% beyond), one resolved step (:class:`StepTiming`), and the per-phase
statistics a report is built from.

Past :data:`EXACT_VALUES`, values land in logarithmic buckets (each 2% wide), so memory grows with the spread of
the values, never with the number of steps, and two histograms merge by adding bucket counts. A quantile is then
placed inside its bucket by its rank among the bucket's values (two phases whose values share a bucket do not read
the same number).
"""

from __future__ import annotations

import collections
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter, methodcaller
from typing import NamedTuple

from perfhooks.events import OTHER, PHASES

_RATIO = 1.02

_INV_LOG_RATIO = 1.0 / math.log(_RATIO)

#: Values at or below this (ms) share the zero bucket.
_FLOOR_MS = 1e-6

_INV_FLOOR_MS = 1.0 / _FLOOR_MS

_log = math.log


def _count_into(counts: dict[int, int], keys: Iterable[int]) -> None:
    for key in keys:
        counts[key] = counts.get(key, 0) + 1


#: ``counts[key] += 1`` for each key, in C (``collections``' helper of ``Counter.update``) where it exists.
_count_elements: Callable[[dict[int, int], Iterable[int]], None] = getattr(collections, "_count_elements",
                                                                           _count_into)

def _keys_ms(values_ms: list[float]) -> Iterable[int]:
    """The buckets of non-negative values in ms (the zero bucket, -1, for those at or below the floor)."""
    if min(values_ms) <= _FLOOR_MS:
        return [-1 if value <= _FLOOR_MS else int(_log(value * _INV_FLOOR_MS) * _INV_LOG_RATIO)
                for value in values_ms]
    return map(int, map(_INV_LOG_RATIO.__mul__, map(_log, map(_INV_FLOOR_MS.__mul__, values_ms))))


#: Values each summary keeps as they came, for exact quantiles (a run of this many steps or fewer).
EXACT_VALUES = 4096
#: Past ``EXACT_VALUES``, one light step in this many (a random one of each run of them) goes into the step and
#: fetch quantiles' buckets; their counts, totals and extremes take every step.
LIGHT_BUCKETS_EVERY = 4


#: A light step's fetch time when its wait was not timed (a step that began dark): far below any sum of waits.
UNTIMED_FETCH = -(1 << 62)


@dataclass
class StreamingStats:
    """Summary of a stream of non-negative durations in milliseconds."""

    count: int = 0
    total: float = 0.0
    maximum: float = 0.0
    minimum: float = math.inf
    _buckets: dict[int, int] = field(default_factory=dict, repr=False)
    #: The values as they came, while there are at most ``EXACT_VALUES`` (None after).
    _values: list[float] | None = field(default_factory=list, repr=False)

    def add(self, value_ms: float) -> None:
        """Add one value (ms); negative values count as 0. Runs once per phase per step: keep it lean."""
        if value_ms <= _FLOOR_MS:
            value_ms = max(0.0, float(value_ms))
        self.count += 1
        self.total += value_ms
        if value_ms > self.maximum:
            self.maximum = value_ms
        if value_ms < self.minimum:
            self.minimum = value_ms
        values = self._values
        if values is not None:
            if len(values) < EXACT_VALUES:
                values.append(value_ms)
                return
            self._bucket_kept()
        key = -1 if value_ms <= _FLOOR_MS else int(_log(value_ms * _INV_FLOOR_MS) * _INV_LOG_RATIO)
        buckets = self._buckets
        buckets[key] = buckets.get(key, 0) + 1

    def _bucket_kept(self) -> None:
        """The kept values go into the buckets, and are kept no more (past ``EXACT_VALUES``: while values are
        kept, the quantiles read them and the buckets wait, so the first steps of a run cost no logarithm)."""
        values, self._values = self._values, None
        if values:
            _count_elements(self._buckets, _keys_ms(values))

    def add_many(self, values_ms: list[float]) -> None:
        """Add a batch of values (ms): the same summary as ``add`` on each, computed by C-level maps (a fold of 64
        steps adds ten of these batches; a Python loop over each value cost more than the rest of a step)."""
        if not values_ms:
            return
        if min(values_ms) <= _FLOOR_MS:  # zeros (a phase a step did not have) or negatives: the zero bucket
            values_ms = [max(0.0, float(value)) for value in values_ms]
        self.count += len(values_ms)
        self.total = sum(values_ms, self.total)
        self.maximum = max(self.maximum, max(values_ms))
        self.minimum = min(self.minimum, min(values_ms))
        values = self._values
        if values is not None:
            if len(values) + len(values_ms) <= EXACT_VALUES:
                values.extend(map(float, values_ms))
                return
            self._bucket_kept()
        _count_elements(self._buckets, _keys_ms(values_ms))

    def add_many_ns(self, values_ns: list[int], keys: list[int] | None = None, start: int = 0,
                    every: int = 1) -> list[int]:
        """Add a batch of values given in ns (integers: the light steps' times), as :meth:`add_many` does with
        them in ms; ``keys``: their buckets, computed by an earlier call on the same values (ignored while values
        are kept). Once more than ``EXACT_VALUES`` were added, only ``values_ns[start::every]`` go into the
        buckets (a sample, which the quantiles then read: each value costs a logarithm); the count, total,
        minimum and maximum take all. The buckets added (none while values are kept)."""
        if not values_ns:
            return []
        if min(values_ns) <= 1:  # 1 ns is the floor (_FLOOR_MS): the zero bucket
            values_ns = [max(0, value) for value in values_ns]
        self.count += len(values_ns)
        self.total += sum(values_ns) / 1e6
        self.maximum = max(self.maximum, max(values_ns) / 1e6)
        self.minimum = min(self.minimum, min(values_ns) / 1e6)
        values = self._values
        bucketed = values_ns
        if values is not None:
            if len(values) + len(values_ns) <= EXACT_VALUES:
                values.extend(map(_NS_TO_MS, values_ns))
                return []
            self._bucket_kept()  # the batch that crosses the limit goes into the buckets whole
            keys = None
        elif every != 1:
            bucketed = values_ns[start::every]
        if keys is None:
            if min(bucketed, default=2) <= 1:
                keys = [-1 if value <= 1 else int(_log(value) * _INV_LOG_RATIO) for value in bucketed]
            else:
                keys = list(map(int, map(_INV_LOG_RATIO.__mul__, map(_log, bucketed))))
        _count_elements(self._buckets, keys)
        return keys

    def copy(self) -> StreamingStats:
        """An independent copy (the buckets and kept values are copied)."""
        return StreamingStats(self.count, self.total, self.maximum, self.minimum, dict(self._buckets),
                              None if self._values is None else list(self._values))

    def merge(self, other: StreamingStats) -> None:
        self.count += other.count
        self.total += other.total
        self.maximum = max(self.maximum, other.maximum)
        self.minimum = min(self.minimum, other.minimum)
        values, theirs = self._values, other._values
        if values is not None and theirs is not None and len(values) + len(theirs) <= EXACT_VALUES:
            values.extend(theirs)
            return
        if values is not None:
            self._bucket_kept()
        buckets = self._buckets
        if theirs is not None:
            _count_elements(buckets, _keys_ms(theirs))
            return
        for key, n in other._buckets.items():
            buckets[key] = buckets.get(key, 0) + n

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1), nearest-rank: exact up to ``EXACT_VALUES`` values, within 1% beyond."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q}")
        if not self.count:
            return 0.0
        values = self._values
        if values is not None:  # every value, as it came
            return sorted(values)[max(1, math.ceil(q * len(values))) - 1]
        # the buckets may hold a sample of the values (:meth:`add_many_ns`): the rank is among those
        rank = max(1, math.ceil(q * sum(self._buckets.values())))
        seen = 0
        for key in sorted(self._buckets):
            in_bucket = self._buckets[key]
            if seen + in_bucket >= rank:
                if key < 0:
                    return min(self.minimum, _FLOOR_MS)
                # the rank's place among the bucket's values, spread over the bucket, clamped to what was observed
                where = (rank - seen - 0.5) / in_bucket
                value = _FLOOR_MS * _RATIO ** (key + where)
                return min(max(value, self.minimum), self.maximum)
            seen += in_bucket
        return self.maximum

    def summary(self, suffix: str = "") -> dict[str, float]:
        """``{count, mean, p50, p95, max}``, with ``suffix`` appended to the value keys (e.g. ``_ms``)."""
        return {
            "count": self.count,
            f"mean{suffix}": round(self.mean, 6),
            f"p50{suffix}": round(self.quantile(0.5), 6),
            f"p95{suffix}": round(self.quantile(0.95), 6),
            f"max{suffix}": round(self.maximum, 6),
        }


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
    #: Host time of the step's fetches (ms). On an accelerator ``phase_ms["data_wait"]`` is the exposed part of
    #: it (the device idle for want of input); on the CPU the two are equal.
    fetch_ms: float = 0.0
    #: torch.compile compiled during the step: not a steady step.
    compiled: bool = False
    #: Samples and tokens the step trained on (0: not counted).
    samples: int = 0
    tokens: int = 0
    #: Token slots, padding included, where the batches' attention_mask was read (0: not read).
    padded_tokens: int = 0
    #: The step's batch shapes (a hash; 0: no batch seen), and whether one was new to the run (shape churn).
    shape: int = 0
    new_shape: bool = False
    #: Its phases were timed (a light step has only its step time and fetch: see :meth:`PhaseStatistics.add_light`).
    detailed: bool = True


_STEP_MS, _PHASE_MS, _FETCH_MS = attrgetter("step_ms"), attrgetter("phase_ms"), attrgetter("fetch_ms")
_MICRO_BATCHES, _SAMPLES, _TOKENS = attrgetter("micro_batches"), attrgetter("samples"), attrgetter("tokens")
_PADDED, _OWN, _COMPILED = attrgetter("padded_tokens"), attrgetter("own"), attrgetter("compiled")
_FIRST, _SECOND, _THIRD, _FOURTH, _FIFTH = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3), itemgetter(4)
_NS_TO_MS = (1e6).__rtruediv__  # ns / 1e6, exactly as a division


class StatsSnapshot(NamedTuple):
    """The statistics at one moment, safe to read on any thread: the folded part is a private copy that is never
    mutated after it is published, and the steps added since are the first ``added`` of a list that only grows
    until the next fold replaces it (taking a snapshot copies nothing). :meth:`thaw` gives a reader its own
    :class:`PhaseStatistics` to compute from (folding it mutates only that copy)."""

    folded: PhaseStatistics
    unfolded: list[StepTiming]
    added: int
    #: Light steps added since the fold (the list, which a fold replaces, and how many; times in ns).
    light: list[tuple[int, int, int, bool, bool]] = []
    light_added: int = 0

    @property
    def tail(self) -> tuple[StepTiming, ...]:
        """The steps added since the fold, in order."""
        return tuple(self.unfolded[:self.added])

    @property
    def steps(self) -> int:
        """Steps resolved so far (no copy)."""
        return self.folded._step.count + self.added + self.light_added

    def thaw(self) -> PhaseStatistics:
        """A new, independent :class:`PhaseStatistics` equal to the one this snapshot was taken of."""
        stats = self.folded.copy()
        for timing in self.tail:
            stats.add(timing)
        for light in self.light[:self.light_added]:
            stats.add_light(*light)
        stats._fold()
        return stats


class PhaseStatistics:
    """Streaming per-phase and per-step statistics over every resolved step, in bounded memory.

    Step times, fetches, micro-batches and the steady steps count every step; phases, samples and tokens count the
    detailed steps (:mod:`~perfhooks.runtime.step.sampling`), and each phase's share is of the detailed steps' time.

    Steps are folded into the histograms in batches of ``fold_every`` (one tight loop per
    series instead of six method calls per step); every read folds what is waiting first.

    Threading: one thread (the training thread) adds and reads; any other thread reads a :meth:`snapshot` that
    thread published, never this object (a read folds, which mutates).
    """

    def __init__(self, history: int = 2048, fold_every: int = 64) -> None:
        self._step = StreamingStats()
        self._phases: dict[str, StreamingStats] = {name: StreamingStats() for name in (*PHASES, OTHER)}
        self._micro_batches = 0
        self._fetch = StreamingStats()
        #: Steps that perfhooks' own work overlapped (a window, its export, a memory capture) and their time (ms),
        #: and totals over the others (the steady steps).
        self.own_steps = 0
        self.own_ms = 0.0
        #: Steps in which torch.compile compiled (and no perfhooks work overlapped): not steady either.
        self.compiled_steps = 0
        self._steady_step = StreamingStats()
        self._steady_phase_total: dict[str, float] = dict.fromkeys((*PHASES, OTHER), 0.0)
        #: Every step's time, own ones included (ms): the run account's training time.
        self.training_ms = 0.0
        #: Samples and tokens over every step, and over the steady ones (0 where the loop's batches were not seen).
        self.samples = self.tokens = 0
        #: Token slots, padding included, over every step whose batches' attention_mask was read.
        self.padded_tokens = 0
        self.steady_samples = self.steady_tokens = 0
        self._unfolded: list[StepTiming] = []
        #: Light steps waiting for the fold: ``(step ns, fetch ns, micro_batches, own, compiled)``.
        self._unfolded_light: list[tuple[int, int, int, bool, bool]] = []
        #: Detailed steps, their time (ms) in all, and the same over the steady ones.
        self.detailed_steps = 0
        #: Steps counted in blocks, none timed alone (:meth:`add_dark`).
        self.dark_steps = 0
        self._detailed_ms = 0.0
        self._steady_detailed = 0
        self._steady_detailed_ms = 0.0
        self._fold_every = fold_every
        #: The most recent resolved steps, for time series and live diagnoses.
        self.recent: deque[StepTiming] = deque(maxlen=history)
        #: A copy of the folded state since the last fold (made by the first :meth:`snapshot` after it).
        self._folded_copy: PhaseStatistics | None = None
        #: The state of the generator that picks which light steps go into the buckets (an int, copied by value).
        self._bucket_seed = 0x5EED

    def _sample(self, every: int) -> int:
        """A pseudo-random offset in ``[0, every)`` (a linear congruential generator: repeatable, and never
        locked onto a loop's period)."""
        self._bucket_seed = (self._bucket_seed * 1103515245 + 12345) & 0x7FFFFFFF
        return (self._bucket_seed >> 16) % every

    def snapshot(self) -> StatsSnapshot:
        """The statistics now, for other threads: a copy of the folded state (made once per fold, so about one
        step in ``fold_every`` pays for it) and the steps added since (the list they are in, which a fold replaces
        and never changes after, and how many)."""
        folded = self._folded_copy
        if folded is None:
            folded = self._folded_copy = self._copy_folded()
        unfolded, light = self._unfolded, self._unfolded_light
        return StatsSnapshot(folded, unfolded, len(unfolded), light, len(light))

    def copy(self) -> PhaseStatistics:
        """An independent copy, folded."""
        self._fold()
        return self._copy_folded()

    def _copy_folded(self) -> PhaseStatistics:
        """A copy of everything folded so far (the steps waiting to be folded are left out)."""
        copy = PhaseStatistics.__new__(PhaseStatistics)
        copy.__dict__.update(self.__dict__)
        copy._step, copy._fetch, copy._steady_step = self._step.copy(), self._fetch.copy(), self._steady_step.copy()
        copy._phases = {name: stats.copy() for name, stats in self._phases.items()}
        copy._steady_phase_total = dict(self._steady_phase_total)
        recent = list(self.recent)
        if self._unfolded:
            del recent[-len(self._unfolded):]
        copy.recent = deque(recent, maxlen=self.recent.maxlen)
        copy._unfolded = []
        copy._unfolded_light = []
        copy._folded_copy = None
        return copy

    def add(self, timing: StepTiming) -> None:
        """A detailed step (its phases timed)."""
        self._unfolded.append(timing)
        self.recent.append(timing)
        if len(self._unfolded) >= self._fold_every:
            self._fold()

    def add_light(self, step_ns: int, fetch_ns: int, micro_batches: int, own: bool, compiled: bool) -> None:
        """A light step: its time and its fetches' host time (ns) only; it is in no phase figure and not in
        :attr:`recent`."""
        light = self._unfolded_light
        light.append((step_ns, fetch_ns, micro_batches, own, compiled))
        if len(light) >= 256:
            self._fold()

    def add_lights(self, steps_ns: list[int], fetches_ns: list[int], own: bool) -> None:
        """Light steps of one micro-batch each, their times and their fetches' (ns; see :meth:`add_light`)."""
        light = self._unfolded_light
        light.extend(zip(steps_ns, fetches_ns, repeat(1), repeat(own), repeat(False)))
        if len(light) >= 256:
            self._fold()

    def add_dark(self, steps: int, wall_ns: int, own: bool) -> None:
        """Dark steps, each of one micro-batch: counted, and their time as one block (ns); in no distribution, since
        no step of them was timed alone."""
        ms = max(0, wall_ns) / 1e6
        self._folded_copy = None
        self.dark_steps += steps
        self._step.count += steps
        self._step.total += ms
        self.training_ms += ms
        self._micro_batches += steps
        if own:
            self.own_steps += steps
            self.own_ms += ms
        else:
            self._steady_step.count += steps
            self._steady_step.total += ms

    def _fold(self) -> None:
        """Fold the steps waiting into the summaries, in one batch (the per-step work in C-level maps: this runs
        on the training thread, once every ``fold_every`` steps)."""
        light, self._unfolded_light = self._unfolded_light, []
        batch, self._unfolded = self._unfolded, []
        if light:
            self._folded_copy = None
            self._fold_light(light)
        if not batch:
            return
        self._folded_copy = None
        self.detailed_steps += len(batch)
        self._detailed_ms += sum(map(_STEP_MS, batch))
        step_ms = list(map(_STEP_MS, batch))
        phases = list(map(_PHASE_MS, batch))
        self._step.add_many(step_ms)
        for name, stats in self._phases.items():
            stats.add_many(list(map(methodcaller("get", name, 0.0), phases)))
        self._fetch.add_many(list(map(_FETCH_MS, batch)))
        self.training_ms += sum(step_ms)
        self._micro_batches += sum(map(_MICRO_BATCHES, batch))
        self.samples += sum(map(_SAMPLES, batch))
        self.tokens += sum(map(_TOKENS, batch))
        self.padded_tokens += sum(map(_PADDED, batch))
        own, compiled = sum(map(_OWN, batch)), sum(map(_COMPILED, batch))
        steady = batch
        if own or compiled:
            self.own_steps += own
            self.own_ms += sum(_STEP_MS(timing) for timing in batch if timing.own)
            self.compiled_steps += sum(1 for timing in batch if timing.compiled and not timing.own)
            steady = [timing for timing in batch if not timing.own and not timing.compiled]
            step_ms, phases = list(map(_STEP_MS, steady)), list(map(_PHASE_MS, steady))
        self._steady_step.add_many(step_ms)
        self._steady_detailed += len(step_ms)
        self._steady_detailed_ms += sum(step_ms)
        self.steady_samples += sum(map(_SAMPLES, steady))
        self.steady_tokens += sum(map(_TOKENS, steady))
        for name in self._steady_phase_total:
            self._steady_phase_total[name] += sum(map(methodcaller("get", name, 0.0), phases))

    def _fold_light(self, light: list[tuple[int, int, int, bool, bool]]) -> None:
        """Fold light steps: step time, fetch, micro-batches, the steady steps; no phase."""
        step_ns = list(map(_FIRST, light))
        start = self._sample(LIGHT_BUCKETS_EVERY)
        keys = self._step.add_many_ns(step_ns, start=start, every=LIGHT_BUCKETS_EVERY)
        fetches = list(map(_SECOND, light))
        if min(fetches) < 0:  # a step whose wait was not timed (it began dark): out of the fetch figures
            fetches = [fetch for fetch in fetches if fetch >= 0]
        self._fetch.add_many_ns(fetches, start=start, every=LIGHT_BUCKETS_EVERY)
        self.training_ms += max(0, sum(step_ns)) / 1e6
        micro_batches = list(map(_THIRD, light))
        if min(micro_batches) >= 1:
            self._micro_batches += sum(micro_batches)
        else:  # a loop that fetches no batch: 1
            self._micro_batches += sum(map(max, repeat(1), micro_batches))
        own = sum(map(_FOURTH, light))
        compiled = sum(1 for entry in light if entry[4] and not entry[3]) if any(map(_FIFTH, light)) else 0
        self.own_steps += own
        self.compiled_steps += compiled
        if own:
            self.own_ms += max(0, sum(entry[0] for entry in light if entry[3])) / 1e6
        if own or compiled:
            self._steady_step.add_many_ns([entry[0] for entry in light if not entry[3] and not entry[4]],
                                          start=start, every=LIGHT_BUCKETS_EVERY)
        elif len(keys) == len(step_ns) or self._steady_step._values is None:  # the same values, sampled the same
            self._steady_step.add_many_ns(step_ns, keys)
        else:
            self._steady_step.add_many_ns(step_ns, start=start, every=LIGHT_BUCKETS_EVERY)

    @property
    def step(self) -> StreamingStats:
        self._fold()
        return self._step

    @property
    def phases(self) -> dict[str, StreamingStats]:
        self._fold()
        return self._phases

    @property
    def fetch(self) -> StreamingStats:
        """Host time of each step's fetches (ms), hidden or not."""
        self._fold()
        return self._fetch

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

    @property
    def sampled_steps(self) -> int:
        """Steps whose phases were timed (the detailed ones)."""
        self._fold()
        return self.detailed_steps

    def throughput(self) -> tuple[float, float, int]:
        """``(samples per s, tokens per s, steps)`` over the steady steps (all steps when none is steady): the
        samples and tokens per step of the detailed steps, at the rate of every step."""
        self._fold()
        if self._steady_step.count and self._steady_step.total > 0 and self._steady_detailed:
            per_s = self._steady_step.count / (self._steady_step.total / 1e3) / self._steady_detailed
            return self.steady_samples * per_s, self.steady_tokens * per_s, self._steady_step.count
        seconds = self._step.total / 1e3
        if seconds <= 0 or not self.detailed_steps:
            return 0.0, 0.0, 0
        per_s = self._step.count / seconds / self.detailed_steps
        return self.samples * per_s, self.tokens * per_s, self._step.count

    def steady_share(self, name: str) -> float:
        """Fraction 0..1 of steady detailed step time spent in phase ``name`` (all steps if none is steady)."""
        self._fold()
        total = self._steady_detailed_ms
        if total <= 0:
            return self.share(name)
        return self._steady_phase_total[name] / total

    def steady_mean(self, name: str) -> float:
        """Mean time (ms) per steady detailed step in phase ``name`` (over all detailed steps if none is steady)."""
        self._fold()
        count = self._steady_detailed
        if not count:
            return self.phases[name].mean
        return self._steady_phase_total[name] / count

    def share(self, name: str) -> float:
        """Fraction 0..1 of the detailed steps' time spent in phase ``name``."""
        self._fold()
        total = self._detailed_ms
        return self._phases[name].total / total if total > 0 else 0.0

    @property
    def coverage(self) -> float:
        """Measured phases (``other`` excluded) over the detailed steps' time, 0..1 (may exceed 1 by clock skew on
        CUDA)."""
        self._fold()
        total = self._detailed_ms
        if total <= 0:
            return 0.0
        return sum(self._phases[name].total for name in PHASES) / total
