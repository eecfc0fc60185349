"""Where a run's wall time went: training steps, evaluation, checkpointing, torch.compile compiling and the rest.

Host time only (``time.perf_counter_ns``): evaluation and checkpoint writes are bracketed by the
integrations (``Engine.aside``); the steps' time comes from the phase statistics. Asides may nest
(a checkpoint written at the end of validation): each nanosecond is charged to the innermost.
"""

from __future__ import annotations

from typing import Any

from perfhooks.events import ASIDES, CHECKPOINT, COMPILING, EVALUATION
from perfhooks.timebase import monotonic_ns


class RunAccount:
    """Host time of evaluation and checkpointing, and the run's wall clock (seconds in the report)."""

    def __init__(self, clock: Any = monotonic_ns) -> None:
        self._clock = clock
        self.first_ns: int | None = None
        #: When the first step or aside began: an evaluation before the first step (HF ``eval_on_start``,
        #: nanoGPT's iteration-0 evaluation) is inside the wall clock it is a share of.
        self.began_ns: int | None = None
        self.end_ns: int | None = None
        self.total_ns: dict[str, int] = dict.fromkeys(ASIDES, 0)
        self.counts: dict[str, int] = dict.fromkeys(ASIDES, 0)
        #: The asides open now, outermost first: [kind, start of the stretch now charged to it] (empty: none; the
        #: tracker tests it in place, at every named hook).
        self.open_asides: list[list[Any]] = []

    def started(self) -> None:
        """The first step started: the wall clock runs from here, or from an aside that began before it."""
        if self.first_ns is None:
            self.first_ns = self._clock()
            if self.began_ns is None:
                self.began_ns = self.first_ns

    @property
    def depth(self) -> int:
        return len(self.open_asides)

    @property
    def innermost(self) -> str | None:
        """The aside open now (the innermost), or ``None``."""
        return self.open_asides[-1][0] if self.open_asides else None

    def begin(self, kind: str) -> None:
        if kind not in ASIDES:
            raise ValueError(f"unknown aside {kind!r}; asides are {', '.join(sorted(ASIDES))}")
        now = self._clock()
        if self.began_ns is None:
            self.began_ns = now
        nested_in_same = bool(self.open_asides) and self.open_asides[-1][0] == kind  # a save inside a save: one save
        if self.open_asides:
            outer = self.open_asides[-1]
            self.total_ns[outer[0]] += now - outer[1]
        self.open_asides.append([kind, now])
        if not nested_in_same:
            self.counts[kind] += 1

    def end(self, kind: str) -> bool:
        """End the innermost aside if it is ``kind``; False (nothing changed) otherwise."""
        if not self.open_asides or self.open_asides[-1][0] != kind:
            return False
        now = self._clock()
        _, start = self.open_asides.pop()
        self.total_ns[kind] += now - start
        if self.open_asides:
            self.open_asides[-1][1] = now
        return True

    def retract(self, kind: str) -> bool:
        """Take back the innermost aside if it is ``kind``: it was not one (it is neither counted nor timed)."""
        if not self.open_asides or self.open_asides[-1][0] != kind:
            return False
        self.open_asides.pop()
        if not (self.open_asides and self.open_asides[-1][0] == kind):
            self.counts[kind] -= 1
        if self.open_asides:
            self.open_asides[-1][1] = self._clock()
        return True

    def close(self) -> None:
        """Training ended: open asides end and the wall clock stops (the first call's time is kept)."""
        while self.open_asides:
            self.end(self.open_asides[-1][0])
        if self.end_ns is None:
            self.end_ns = self._clock()

    def section(self, training_ms: float) -> dict[str, Any] | None:
        """The report's ``run`` section (seconds); ``None`` before the first step."""
        if self.first_ns is None:
            return None
        end = self.end_ns if self.end_ns is not None else self._clock()
        began = self.began_ns if self.began_ns is not None else self.first_ns
        wall_s = max(0.0, (end - min(began, self.first_ns)) / 1e9)
        evaluation_s = self.total_ns[EVALUATION] / 1e9
        checkpointing_s = self.total_ns[CHECKPOINT] / 1e9
        compiling_s = self.total_ns[COMPILING] / 1e9
        training_s = training_ms / 1e3
        other_s = max(0.0, wall_s - training_s - evaluation_s - checkpointing_s - compiling_s)

        def share(seconds: float) -> float:
            return round(seconds / wall_s, 6) if wall_s > 0 else 0.0

        return {
            "wall_s": round(wall_s, 6),
            "training_s": round(training_s, 6),
            "evaluation_s": round(evaluation_s, 6),
            "checkpointing_s": round(checkpointing_s, 6),
            "compiling_s": round(compiling_s, 6),
            "other_s": round(other_s, 6),
            "evaluations": self.counts[EVALUATION],
            "checkpoints": self.counts[CHECKPOINT],
            "compilations": self.counts[COMPILING],
            "shares": {"training": share(training_s), "evaluation": share(evaluation_s),
                       "checkpointing": share(checkpointing_s), "compiling": share(compiling_s),
                       "other": share(other_s)},
        }
