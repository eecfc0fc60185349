"""When capture windows open: a pure function from the step number to an action.

The parameters mean what they mean in ``torch.profiler.schedule``: skip ``skip_first`` steps,
then repeat cycles of ``wait`` idle steps, ``warmup`` steps with the profiler started but its
results discarded, and ``active`` recorded steps, the last of which saves the trace.
``repeat=0`` repeats for the whole run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    """What the capture window does at a step."""

    NONE = "none"
    WARMUP = "warmup"
    ACTIVE = "active"
    ACTIVE_AND_SAVE = "active_and_save"

    @property
    def recording(self) -> bool:
        return self in (Action.ACTIVE, Action.ACTIVE_AND_SAVE)


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"Schedule {name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"Schedule {name} must be an integer >= {minimum}, got {value}")


@dataclass(frozen=True)
class Schedule:
    """A cyclic capture schedule; call it with a step (0-based optimizer steps) to get an :class:`Action`.

    Args:
        skip_first: steps to skip before the first cycle.
        wait: idle steps at the start of each cycle.
        warmup: steps with the profiler running but discarded, before recording.
        active: recorded steps per cycle (at least 1); the last one saves the trace.
        repeat: number of cycles; 0 repeats until the run ends.
    """

    skip_first: int = 8
    wait: int = 0
    warmup: int = 2
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            _check_count(name, getattr(self, name), 0)
        _check_count("active", self.active, 1)

    @property
    def cycle_steps(self) -> int:
        """Steps in one wait + warmup + active cycle."""
        return self.wait + self.warmup + self.active

    def __call__(self, step: int) -> Action:
        if step < self.skip_first:
            return Action.NONE
        step -= self.skip_first
        cycle, position = divmod(step, self.cycle_steps)
        if self.repeat and cycle >= self.repeat:
            return Action.NONE
        if position < self.wait:
            return Action.NONE
        if position < self.wait + self.warmup:
            return Action.WARMUP
        return Action.ACTIVE_AND_SAVE if position == self.cycle_steps - 1 else Action.ACTIVE

    def next_action_step(self, step: int) -> int | None:
        """The first step at or after ``step`` whose action is not ``NONE`` (None: there is none)."""
        start = max(step, self.skip_first)
        cycle, position = divmod(start - self.skip_first, self.cycle_steps)
        if self.repeat and cycle >= self.repeat:
            return None
        if position < self.wait:
            return self.skip_first + cycle * self.cycle_steps + self.wait
        return start


@dataclass(frozen=True)
class OnDemandWindow:
    """One window asked for at run time (trigger file or signal), starting at ``first_step``."""

    first_step: int
    warmup: int = 1
    active: int = 3

    def __call__(self, step: int) -> Action:
        position = step - self.first_step
        if position < 0 or position >= self.warmup + self.active:
            return Action.NONE
        if position < self.warmup:
            return Action.WARMUP
        return Action.ACTIVE_AND_SAVE if position == self.warmup + self.active - 1 else Action.ACTIVE

    @property
    def last_step(self) -> int:
        return self.first_step + self.warmup + self.active - 1

    def next_action_step(self, step: int) -> int | None:
        """The first step at or after ``step`` whose action is not ``NONE`` (None: there is none)."""
        if step > self.last_step:
            return None
        return max(step, self.first_step)
