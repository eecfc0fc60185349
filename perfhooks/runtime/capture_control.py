"""The capture controller: which step records a ``torch.profiler`` window, and why.

Three sources open windows: the schedule (a pure function of the step), this rank's on-demand trigger
(``<output_dir>/TRIGGER`` or SIGUSR2), and, with several ranks, the windows every rank agreed on through the
process group's store (:mod:`perfhooks.distributed.all_ranks`). At each step's start the controller picks the
action for that step and drives :class:`~perfhooks.capture.windows.CaptureWindows`.

Threading: the training thread drives it; the all-ranks watcher hands targets over through a deque.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.capture.schedule import Action, OnDemandWindow
from perfhooks.capture.trigger import OnDemandTrigger
from perfhooks.capture.windows import CaptureWindows, WindowSettings
from perfhooks.config import PerfConfig
from perfhooks.distributed import store as rank_store
from perfhooks.distributed.all_ranks import AllRanksTrigger, Target, next_run
from perfhooks.faults import FaultLog, Once
from perfhooks.files.writer import BackgroundWriter


class CaptureControl:
    """Schedule, on-demand and all-ranks windows for one run."""

    def __init__(self, config: PerfConfig, *, output_dir: Path, rank: int, world_size: int, cuda: bool,
                 writer: BackgroundWriter, faults: FaultLog, once: Once, current_step: Callable[[], int],
                 on_saved: Callable[[], None], on_written: Callable[[Path, dict[str, Any]], None] | None) -> None:
        self.config = config
        self.rank = rank
        self.faults = faults
        self.once = once
        if config.nsys_capture and not cuda:
            once.warn("nsys_cpu", "nsys_capture needs CUDA; it is off for this run")
        self.windows = CaptureWindows(
            output_dir / "traces", rank, world_size, self.action, WindowSettings(
                record_shapes=config.record_shapes, profile_memory=config.profile_memory,
                with_stack=config.with_stack, cuda=cuda, nsys_capture=config.nsys_capture,
                detach_cupti=config.detach_cupti,
                max_traces=config.max_traces, max_trace_bytes=config.max_trace_bytes,
                rss_limit_bytes=config.window_rss_limit_bytes, max_micro_batches=config.window_micro_batches),
            writer, faults, once, on_saved=on_saved, on_written=on_written)
        self.trigger = OnDemandTrigger(output_dir, config.trigger_poll_s) if config.on_demand else None
        if self.trigger is not None and self.trigger.signal_skipped:
            once.warn("sigusr2_native", self.trigger.signal_skipped)
        #: With a process group of 2 or more ranks: the trigger that opens a window on every rank (else None).
        self.all_ranks: AllRanksTrigger | None = None
        if self.trigger is not None and world_size > 1:
            self.all_ranks = self._all_ranks_trigger(self.trigger, current_step)
        self._on_demand: OnDemandWindow | None = None
        #: The window every rank agreed on that ``_on_demand`` opens, if it came from the store.
        self._agreed: Target | None = None
        #: Agreed windows the run ended before recording (:meth:`unreached`), for the report.
        self.missed: list[dict[str, int]] = []
        self._driven_at: int | None = None

    def _all_ranks_trigger(self, local: OnDemandTrigger, current_step: Callable[[], int]) -> AllRanksTrigger | None:
        """Start the watcher thread that shares on-demand windows through the process group's store."""
        try:
            store = rank_store.default_store()
            if store is None:
                return None
            schedule = self.config.schedule

            def is_free(step: int) -> bool:
                return schedule is None or schedule(step) is Action.NONE

            watcher = AllRanksTrigger(store, next_run(), self.rank, local, self.config.trigger_poll_s,
                                      current_step, 1 + self.config.on_demand_active, is_free, self.once)
            watcher.start()
            return watcher
        except Exception as error:
            self.faults.report("trigger_store", error)
            return None

    def action(self, step: int) -> Action:
        """The capture action at ``step``: an on-demand window first, then the schedule (pure in the step)."""
        if self._on_demand is not None:
            action = self._on_demand(step)
            if action is not Action.NONE:
                return action
        schedule = self.config.schedule
        return schedule(step) if schedule is not None else Action.NONE

    @property
    def is_open(self) -> bool:
        return self.windows.is_open

    def quiet_after(self, step: int, look_ahead: int) -> tuple[int, int]:
        """``(steps, ns)``: the step before which no window can open or change (at most ``look_ahead`` steps on),
        and the ``monotonic_ns()`` before which no on-demand request is looked for; ``(step, 0)`` when a window
        is open or ranks agree on windows through the store (their targets are a few steps ahead)."""
        if self.windows.is_open or self.all_ranks is not None:
            return step, 0
        until = step + look_ahead
        for source in (self._on_demand, self.config.schedule):
            if source is None:
                continue
            next_action = getattr(source, "next_action_step", None)
            if next_action is not None:  # perfhooks' own schedules say it at once
                found = next_action(step + 1)
                if found is not None:
                    until = min(until, found)
                continue
            ahead = step + 1  # a schedule that is a plain function of the step: looked at step by step
            while ahead < until and source(ahead) is Action.NONE:
                ahead += 1
            until = ahead
        return until, self.trigger.next_poll_ns if self.trigger is not None else 2**62

    def end_step_label(self) -> None:
        self.windows.end_step_label()

    def defer_to(self, owner: str) -> None:
        """Another ``torch.profiler`` user is configured (e.g. Lightning's PyTorchProfiler): open no window."""
        self.windows.defer_to(owner)

    def at_step(self, step: int, micro_batches: int = 0) -> Action:
        """A step starts: take the triggers, then open, step or close the window (once per step number: a step
        discarded by ``idle`` has driven the windows already); the step's action. ``micro_batches``: those of the
        step that just ended."""
        if self._driven_at == step:
            return self.action(step)
        self._driven_at = step
        trigger = "schedule"
        try:
            if self._take_triggers(step):
                trigger = "on_demand"
        except Exception as error:
            self.faults.report("trigger", error)
        try:
            return self.windows.at_step(step, trigger, micro_batches)
        except Exception as error:
            self.faults.report("window", error)
            return self.action(step)

    def _take_triggers(self, step: int) -> bool:
        """True when an on-demand window records at ``step``."""
        if self.all_ranks is not None and self.all_ranks.lost:
            self.all_ranks = None  # the store is gone: this rank's own trigger from now on
        if self.all_ranks is not None:
            if self.all_ranks.targets:  # a deque's length: the training thread makes no store call
                self._take_shared_windows(step)
        elif self.trigger is not None and self.trigger.poll():
            if self.windows.is_open or self.action(step) is not Action.NONE:
                self.once.warn("trigger_busy", "on-demand trigger ignored: a capture window is already open")
            else:
                self._on_demand = OnDemandWindow(step, warmup=1, active=self.config.on_demand_active)
        return self._on_demand is not None and self._on_demand(step) is not Action.NONE

    def _take_shared_windows(self, step: int) -> None:
        """Windows every rank agreed on through the store: open each at its step, or say why this rank can't."""
        targets = self.all_ranks.targets  # type: ignore[union-attr]
        while targets:
            target = targets.popleft()
            asked = f"asked for by rank {target.by_rank}" if target.by_rank >= 0 else "asked for"
            if target.first_step < step:
                self.once.warn(f"trigger_missed_{target.index}",
                               f"the on-demand window at step {target.first_step} ({asked}) is not recorded on "
                               f"rank {self.rank}: this rank was already at step {step} when it learnt of it "
                               "(the other ranks record it)")
            elif self._on_demand is not None and self._on_demand.last_step >= step:
                self.once.warn("trigger_busy", "on-demand trigger ignored: a capture window is already open")
            else:
                self._on_demand = OnDemandWindow(target.first_step, warmup=1, active=self.config.on_demand_active)
                self._agreed = target

    def unreached(self, step: int) -> list[dict[str, int]]:
        """At the close (``step``: the steps run): the windows every rank agreed on that recorded nothing here, the
        run having ended before their first recorded step. Each is said once and kept in :attr:`missed`."""
        agreed = [self._agreed] if self._agreed is not None else []
        learnt = list(self.all_ranks.targets) if self.all_ranks is not None else []
        for target in agreed + learnt:
            if target.first_step + 1 < step:  # its first recorded step ran
                continue
            asked = f" at step {target.asked_step}" if target.asked_step >= 0 else ""
            by = f" by rank {target.by_rank}" if target.by_rank >= 0 else ""
            self.once.warn(f"trigger_unreached_{target.index}",
                           f"the on-demand window asked for{asked}{by} was to start at step {target.first_step}; "
                           f"the run ended at step {step}: nothing was recorded")
            self.missed.append({"first_step": target.first_step, "asked_step": target.asked_step,
                                "by_rank": target.by_rank, "ended_at_step": step})
        self._agreed = None
        return self.missed

    def release_signal(self) -> None:
        """Put back the SIGUSR2 handler the trigger found (main thread; no lock)."""
        if self.trigger is not None:
            self.trigger.close()

    def stop_triggers(self) -> None:
        """The close: the all-ranks watcher and the local trigger (its signal handler) end."""
        if self.all_ranks is not None:
            try:
                self.all_ranks.close()
            except Exception as error:
                self.faults.report("trigger_close", error)
        if self.trigger is not None:
            try:
                self.trigger.close()
            except Exception as error:
                self.faults.report("trigger_close", error)
