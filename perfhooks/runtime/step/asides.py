"""Asides: evaluation, a checkpoint write or compilation inside a run, timed apart and taken out of the step they
interrupt, with their own NVTX range and profiler label (a part of
:class:`~perfhooks.runtime.step.tracker.StepTracker`)."""

from __future__ import annotations

from typing import Any

import torch.autograd.profiler as autograd_profiler

from perfhooks.events import ASIDES


class Asides:
    """The tracker's asides (a mixin of :class:`~perfhooks.runtime.step.tracker.StepTracker`)."""

    listener: Any
    account: Any
    clock: Any
    nvtx: Any
    record: Any
    phase: Any
    closed: bool
    light: bool
    dark_left: int
    _nvtx_on: bool
    _aside_mark: Any
    _aside_labels: list[Any]
    _short_left: int
    _wait_from: int
    _light_fetch_ns: int
    _light_aside_ns: int
    _light_aside_from: int
    _step_now: Any
    close_phase: Any
    end_step_label: Any
    _dark_to_light: Any

    def aside_start(self, kind: str) -> None:
        """Evaluation or a checkpoint write starts: timed apart, out of the open step and its ``ProfilerStep``."""
        if self.closed:
            return
        if kind not in ASIDES:
            raise ValueError(f"unknown aside {kind!r}; asides are {', '.join(sorted(ASIDES))}")
        self.listener.aside_opening(kind)
        if self.dark_left:
            self._dark_to_light()
        if self.phase is not None:
            self.close_phase()
        self.end_step_label()
        if self.account.depth == 0:
            if self.record is not None:
                self._aside_mark = (kind, self.clock.mark())
            elif self.light:
                now = self._step_now()
                self._short_left = 0  # the step's end takes the long path (its aside is taken out)
                if self._wait_from:  # a wait cut short by the aside
                    self._light_fetch_ns += now - self._wait_from
                    self._wait_from = 0
                self._light_aside_from = now
        self.account.begin(kind)
        if self._nvtx_on:
            self.nvtx.push(kind)
        label = None
        if autograd_profiler._is_profiler_enabled:
            label = autograd_profiler.record_function(kind)
            label.__enter__()
        self._aside_labels.append(label)

    def aside_end(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) ends; an unmatched end is ignored."""
        if not self.account.end(kind):
            return
        self._pop_aside_annotations()
        if self.account.depth == 0 and self._light_aside_from:
            if self.light:
                self._light_aside_ns += self._step_now() - self._light_aside_from
            self._light_aside_from = 0
        if self.account.depth == 0 and self._aside_mark is not None:
            outer, start = self._aside_mark
            self._aside_mark = None
            if self.record is not None:
                self.record.intervals.append((outer, start, self.clock.mark()))

    def aside_cancel(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) was not one: it is neither counted nor timed, and what
        follows belongs to the step that opens next."""
        if not self.account.retract(kind):
            return
        self._pop_aside_annotations()
        if self.account.depth == 0:
            self._aside_mark = None
            self._light_aside_from = 0

    def _pop_aside_annotations(self) -> None:
        """Close the innermost aside's profiler label and NVTX range."""
        label = self._aside_labels.pop() if self._aside_labels else None
        if label is not None:
            label.__exit__(None, None, None)
        if self._nvtx_on:
            self.nvtx.pop()
