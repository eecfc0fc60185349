"""One on-demand trigger for every rank: the window's first step agreed through the process group's store.

A rank that sees its trigger (``<output_dir>/TRIGGER`` or SIGUSR2) picks a target optimizer step far enough
ahead for every rank to learn of it, and offers it under ``perfhooks/t<run>/window<g>`` with ``compare_set``:
the first offer for window ``g`` wins, so ranks triggered at once agree on one window. Every rank's watcher
thread checks for the next window's key every ``poll_s`` seconds and hands the target to the training thread
through a deque. The training thread makes no store call and issues no collective; it reads the deque at each
step start (one attribute test).

The target is the rank's current step plus the steps that pass in two poll intervals and half a second of
slack, at the fastest step rate this thread measured between two polls (at least 2 steps). It is moved past
any scheduled window, so that the window is the same on every rank whatever the schedule. Ranks count
optimizer steps alike (the schedule is a pure function of the step), so ``ProfilerStep#N`` is the same N on
every rank.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perfhooks.capture.trigger import OnDemandTrigger
from perfhooks.faults import Once
from perfhooks.timebase import monotonic

PREFIX = "perfhooks/t"
#: Seconds a rank may be late to see a published window, beyond two poll intervals.
SLACK_S = 0.5
#: Steps ahead at the least: the rank that publishes may be a step ahead of another.
MIN_MARGIN = 2
#: Steps searched past the margin for a stretch the schedule leaves free.
SEARCH_STEPS = 100_000
_STARTS = itertools.count()


def next_run() -> int:
    """The index of this process's next multi-rank run: every rank of a sweep agrees on it."""
    return next(_STARTS)


@dataclass(frozen=True)
class Target:
    """A window every rank opens: its first step (warm-up) and the rank whose trigger asked for it."""

    first_step: int
    by_rank: int
    index: int
    #: The asking rank's step when its trigger was seen (-1: not known).
    asked_step: int = field(default=-1, compare=False)

    def encode(self) -> str:
        return f"{self.first_step}:{self.by_rank}:{self.asked_step}"

    @classmethod
    def decode(cls, value: bytes | str, index: int) -> Target:
        text = value.decode() if isinstance(value, bytes) else value
        first, by_rank, asked, *_ = [*text.split(":"), "-1", "-1"]
        return cls(int(first), int(by_rank or -1), index, int(asked or -1))


def margin_steps(steps_per_s: float, poll_s: float) -> int:
    """Steps that pass before every rank has polled the store at least once more (2 polls + slack)."""
    return max(MIN_MARGIN, math.ceil(steps_per_s * (2 * poll_s + SLACK_S)) + 1)


def choose_target(step: int, margin: int, window_steps: int, is_free: Callable[[int], bool]) -> int:
    """The first step at or after ``step + margin`` that starts ``window_steps`` steps the schedule leaves free."""
    first = step + margin
    for candidate in range(first, first + SEARCH_STEPS):
        if all(is_free(candidate + i) for i in range(window_steps)):
            return candidate
    return first  # a schedule that records all the time: the on-demand window takes precedence over it


class StepRate:
    """The fastest step rate between two consecutive polls of the last few, from ``(time, step)`` samples taken
    by the watcher: an evaluation or a checkpoint between them slows an average, not the steps that follow."""

    def __init__(self, keep: int = 10) -> None:
        self._samples: deque[tuple[float, int]] = deque(maxlen=keep)

    def sample(self, now_s: float, step: int) -> None:
        self._samples.append((now_s, step))

    def rate(self) -> float | None:
        """Steps per second, or None until two consecutive samples some steps apart exist."""
        samples = list(self._samples)
        rates = [(s1 - s0) / (t1 - t0) for (t0, s0), (t1, s1) in itertools.pairwise(samples)
                 if s1 > s0 and t1 > t0]
        return max(rates) if rates else None


class AllRanksTrigger:
    """Watches this rank's trigger and the store off the training thread; targets arrive in :attr:`targets`.

    Args:
        store: the process group's key-value store (``set``/``get``/``check``/``compare_set``).
        run: this run's index (:func:`next_run`), the same on every rank.
        rank: this rank.
        local: this rank's file/signal trigger.
        poll_s: seconds between two looks at the trigger and the store.
        current_step: the training thread's optimizer step (a plain int read).
        window_steps: steps an on-demand window spans (warm-up and recorded).
        is_free: whether the schedule leaves a step free of windows.
    """

    def __init__(self, store: Any, run: int, rank: int, local: OnDemandTrigger, poll_s: float,
                 current_step: Callable[[], int], window_steps: int, is_free: Callable[[int], bool],
                 once: Once, clock: Callable[[], float] = monotonic) -> None:
        self.store = store
        self.prefix = f"{PREFIX}{run}/window"
        self.rank = rank
        self.local = local
        self.poll_s = poll_s
        self.current_step = current_step
        self.window_steps = window_steps
        self.is_free = is_free
        self.once = once
        self.clock = clock
        #: Windows learnt from the store, oldest first; the training thread pops them (deque: thread-safe).
        self.targets: deque[Target] = deque()
        self.rate = StepRate()
        self._next_index = 0
        self._latest: Target | None = None
        self._asked = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The store stopped answering: the watcher has stopped, and the engine goes back to this rank's trigger.
        self.lost = False

    def _key(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="perfhooks-trigger", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as error:  # the store stopped answering (rank 0's process, which serves it, ended)
                self.lost = True
                if self._stop.is_set():  # the run has closed: rank 0 ending is expected, and this daemon thread
                    return  # may now be outliving the interpreter's shutdown, when a write to stderr can abort it
                self.once.warn("trigger_store_lost", f"the process group's store stopped answering "
                               f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                               f"an on-demand trigger now opens a window on rank {self.rank} only")
                return

    def poll_once(self) -> None:
        """One look: windows other ranks published, then this rank's own trigger (which may publish one)."""
        step = self.current_step()
        self.rate.sample(self.clock(), step)
        self._learn()
        if self.local.take():
            self._asked = True
        if not self._asked:
            return
        latest = self._latest
        if latest is not None and step <= latest.first_step + self.window_steps - 1:
            self._asked = False
            self.once.warn("trigger_joined", f"on-demand trigger on rank {self.rank} joins the window that starts "
                                             f"at step {latest.first_step} on every rank")
            return
        rate = self.rate.rate()
        if rate is None:  # no step rate yet (the first steps, or a pause): ask again at the next poll
            return
        self._asked = False
        target = choose_target(step, margin_steps(rate, self.poll_s), self.window_steps, self.is_free)
        offer = Target(target, self.rank, self._next_index, step)
        agreed = self.store.compare_set(self._key(offer.index), "", offer.encode())
        self._accept(Target.decode(agreed, offer.index))

    def _learn(self) -> None:
        while self.store.check([self._key(self._next_index)]):
            self._accept(Target.decode(self.store.get(self._key(self._next_index)), self._next_index))

    def _accept(self, target: Target) -> None:
        self._next_index = target.index + 1
        self._latest = target
        self.targets.append(target)

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the watcher; a store call in flight is not waited for beyond ``timeout_s`` (a daemon thread)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
