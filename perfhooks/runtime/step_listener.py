"""The parts of a run and what each does at a step's moments (the tracker's
:class:`~perfhooks.runtime.step.steps.StepListener`).

At a step's start the capture controller drives its window, compile tracking looks for dynamo, memory takes a
sample and FLOP arming decides whether to count the step; at a phase start FLOP arming watches for the forward
and the optimizer and CUDA allocations are tagged; at a phase end memory samples; at a step's end W&B gets its
rows and the engine publishes the run's state. The tracker is told of phase moments only while a part needs them
(:meth:`RunParts.set_phase_notices`), so the hot path skips the others. The close's device drain and a signal's window
stop are the lifecycle's (:mod:`perfhooks.runtime.ending.lifecycle`); the report's slower parts are taken by
:func:`perfhooks.runtime.state.reporting.report_parts`.

Threading: the training thread only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from perfhooks.capture.schedule import Action
from perfhooks.device import cuda_extras
from perfhooks.events import COMPILING, EVALUATION, FORWARD
from perfhooks.faults import FaultLog
from perfhooks.files.writer import BackgroundWriter
from perfhooks.memory.monitor import MemoryMonitor
from perfhooks.runtime.capture_control import CaptureControl
from perfhooks.runtime.hooks.torch_hooks import HookHandles, watch_evaluation_forwards
from perfhooks.runtime.state.outputs import RunOutputs
from perfhooks.runtime.state.saving import ReportSaving
from perfhooks.runtime.step.tracker import StepTracker
from perfhooks.runtime.throughput.flop_arming import FlopArming, token_slots
from perfhooks.runtime.torch_compile import CompileTracking
from perfhooks.timebase import monotonic_ns

#: Bound once: a user's test that patches torch's or threading's functions changes nothing here.
_grad_enabled, _graph_task, _thread = torch.is_grad_enabled, torch._C._current_graph_task_id, threading.get_ident

#: At most this many steps, and this long (ns), pass without a step's opening (:meth:`RunParts._quiet`): a
#: signal's on-demand request, or dynamo loaded mid-run, waits that long at most. A schedule that is a plain
#: function (not perfhooks' :class:`~perfhooks.capture.schedule.Schedule`) is looked at that many steps ahead.
QUIET_STEPS = 64
QUIET_NS = 100_000_000


class RunParts:
    """The capture controller, memory, FLOP arming, compile tracking and the outputs, routed at each step."""

    def __init__(self, tracker: StepTracker, capture: CaptureControl, memory: MemoryMonitor | None,
                 flops: FlopArming, compile: CompileTracking, outputs: RunOutputs, writer: BackgroundWriter,
                 faults: FaultLog, published: Callable[[], Any], saving: ReportSaving,
                 hooks: HookHandles | None = None) -> None:
        """``hooks``: the run's hook handles, which the evaluation probe's join (removed with them at the end)."""
        self.tracker = tracker
        self.capture = capture
        self.memory = memory
        self.flops = flops
        self.compile = compile
        self.outputs = outputs
        self.writer = writer
        self.faults = faults
        #: Publish the run's state (the engine's): called at each step's end.
        self.published = published
        self.saving = saving
        #: A CUDA error ended the run: no device call from here on (the context may be broken).
        self.device_broken = False
        #: The recipe an integration read from its framework's objects (see :meth:`Engine.note_recipe`), or None.
        self.recipe: dict[str, Any] | None = None
        #: The step at whose end the run's first answer is written, printed and logged (its settings' and recipe's
        #: verdicts need no trace): before the default schedule's first window.
        first = capture.config.first_answer_step  # none where the report is written only at windows and the end
        self.early_answer_at = first if first is not None and capture.config.report_every_s else 1 << 62
        #: The settings audit (:class:`~perfhooks.device.settings.SettingsAudit`), read at each full publication;
        #: None when it could not start.
        self.settings: Any = None
        #: The hooks that look at an evaluation's forwards while one is open (:meth:`aside_opening`).
        self._evaluation_probe = HookHandles()
        self._evaluation_thread = 0
        if hooks is not None:
            hooks.add(self._evaluation_probe)
        self._recording_seen = False  # whether a window recorded at the last step opening (its forwards watched)
        #: Why the run's phases were never seen (the module given is not the one the loop calls), or None.
        self.module_not_called: str | None = None
        #: Tag CUDA allocations with the phase (``_set_memory_metadata``) while an allocation history records.
        self.tag_allocations = memory is not None and memory.cuda and cuda_extras.tags_supported()
        self._writer_seen = self._captures_seen = 0
        #: The schedule is a plain function of the step (looked at step by step to find the next window); a run
        #: with no schedule has none to look at.
        schedule = capture.config.schedule
        self._plain_schedule = schedule is not None and not hasattr(schedule, "next_action_step")
        #: The step that just opened must be detailed (set at each step's opening).
        self.needs_detail = False
        tracker.listener = self
        if capture.trigger is not None:  # a signal's request is looked at from the next step on
            capture.trigger.on_request = tracker.wake  # type: ignore[method-assign]
        self.set_phase_notices()

    def set_phase_notices(self) -> None:
        """Tell the tracker which phase moments a part needs now."""
        tagging = self.tag_allocations and self.memory.history  # type: ignore[union-attr]
        # a window's memory bound is checked at each micro-batch's forward while it records
        self.tracker.notify_phases = self.flops.watching or tagging or self.capture.windows.recording
        self.tracker.observe_phases = self.memory is not None and not self.device_broken

    def stop_flop_count(self, keep: bool) -> None:
        if self.flops.watching:
            self.flops.stop(keep)
            self.set_phase_notices()

    # ----------------------------------------------------------------- StepListener
    def device_lost(self) -> None:
        """The device raised a CUDA error (the user's, or seen first by perfhooks' call): no device call from here
        on; no window opens, memory is not sampled."""
        self.device_broken = True
        self.set_phase_notices()

    def step_opening(self, step: int) -> bool:
        """A step opens: windows, compile watch, memory, FLOPs. True when perfhooks' own work overlaps it."""
        capture = self.capture
        # a window's profiler would call the broken device
        action = capture.action(step) if self.device_broken else capture.at_step(step, self.tracker.last_micro_batches)
        if capture.windows.recording is not self._recording_seen:  # a window's forwards are watched while it records
            self._recording_seen = capture.windows.recording
            self.set_phase_notices()
        self.compile.watch.maybe_install()  # dynamo's callbacks once dynamo is loaded (a check after)
        memory = self.memory
        if memory is not None and not self.device_broken and monotonic_ns() >= memory.next_step_ns:
            try:
                memory.observe_step_start(step)
            except Exception as error:
                self.faults.report("memory_sample", error)
        flops = self.flops
        if flops.watching:
            flops.stop(micro_batches=self.tracker.last_micro_batches)  # the step just ended (no optimizer seen)
            self.set_phase_notices()
        elif flops.may_count and action is Action.WARMUP:
            flops.arm(compiled=self.compile.model_compiled or self.compile.compiled_in_run(), step=step)
            self.set_phase_notices()
        elif self.tag_allocations and self.tracker.notify_phases and not self.memory.history:  # type: ignore[union-attr]
            self.set_phase_notices()  # the allocation history stopped: no more tags
        writer = self.writer
        self._writer_seen = writer.started
        # a window's steps, a FLOP count's and those near a memory capture (the allocation history records) are
        # detailed whatever the budget
        needs_detail = self.needs_detail = (action is not Action.NONE or capture.windows.is_open
                                            or self.flops.watching or (memory is not None and memory.history))
        if not needs_detail and not self.device_broken:
            self._quiet(step)
        # perfhooks' allocation history records a Python stack at every allocation: its steps are perfhooks'
        return (capture.windows.is_open or writer.running
                or (memory is not None and memory.history_owner == "perfhooks"))

    def _quiet(self, step: int) -> None:
        """Tell the tracker until when the steps need no opening: no window, trigger, memory sample or compile
        watch is due before then (:data:`QUIET_STEPS` steps and :data:`QUIET_NS` at most)."""
        tracker = self.tracker
        until_step, until_ns = self.capture.quiet_after(step, QUIET_STEPS if self._plain_schedule else 1 << 30)
        if until_step <= step + 1:
            return
        until_ns = min(until_ns, monotonic_ns() + QUIET_NS)
        if self.memory is not None:
            until_ns = min(until_ns, self.memory.next_step_ns)
        tracker.quiet_until_step, tracker.quiet_until_ns = until_step, until_ns

    def phase_opening(self, name: str) -> None:
        windows = self.capture.windows
        if name == FORWARD and windows.recording:
            record = self.tracker.record
            counted = record.micro_batches if record is not None else 0
            if windows.forward_starting(self.tracker.step, max(counted, self.tracker.last_micro_batches)):
                self.set_phase_notices()
                if record is not None:
                    record.own = True
        if self.flops.watching:
            self.flops.phase_opening(self.tracker.step, name, self.tracker.record)
            if not self.flops.watching:  # the count just ended: the tokens it was measured on
                record = self.tracker.record  # padded slots where a mask was read: the model runs on padding too
                self.flops.measured_tokens = token_slots(record) if record is not None else 0
            self.set_phase_notices()
        if self.tag_allocations and self.memory.history:  # type: ignore[union-attr]
            cuda_extras.tag_allocations(name)  # the snapshot shows each allocation's phase

    def phase_closed(self, name: str) -> bool:
        memory, tracker = self.memory, self.tracker
        try:
            memory.observe(tracker.step, name)  # type: ignore[union-attr]
            tracker.observe_after_ns = memory.next_sample_ns  # type: ignore[union-attr]
            if self.tag_allocations and memory.history and not tracker.notify_phases:  # type: ignore[union-attr]
                self.set_phase_notices()  # the approach armed the allocation history: tag allocations from here on
            if len(memory.captures) != self._captures_seen:  # type: ignore[union-attr]  # a capture paused the step
                self._captures_seen = len(memory.captures)  # type: ignore[union-attr]
                return True
        except Exception as error:
            self.faults.report("memory_sample", error)
        return False

    def aside_opening(self, kind: str) -> None:
        if kind != COMPILING:
            self.stop_flop_count(keep=False)  # evaluation inside the counted step: no count, not a wrong one
        if kind == EVALUATION and self.settings is not None and not self._evaluation_probe.active:
            self.faults.call("evaluation_probe", self._probe_evaluation)

    def _probe_evaluation(self) -> None:
        """Watch the evaluation's forwards for ones that build autograd graphs (grad enabled): hooks on the run's
        models from the evaluation's start to the first forward after it (no cost on training steps)."""
        self._evaluation_thread = _thread()
        watch_evaluation_forwards(list(self.settings.models), self._evaluation_forward, self._evaluation_probe)

    def _evaluation_forward(self, module: Any) -> None:
        if self.tracker.account.innermost != EVALUATION:  # the evaluation ended: the probe comes off
            self._evaluation_probe.remove()
        elif _grad_enabled() and _thread() == self._evaluation_thread and _graph_task() == -1:
            self.settings.evaluation_graphs += 1

    def step_closing(self) -> bool:
        writer = self.writer
        started = writer.started
        if started != self._writer_seen:  # it started during the step (a quiet step's opening did not look)
            self._writer_seen = started
            return True
        return writer.running

    def step_closed(self) -> None:
        outputs = self.outputs
        if outputs.wandb is not None:
            tracker = self.tracker
            if tracker.step >= outputs.next_rows_at:
                outputs.step_closed(tracker.step, tracker.global_step, tracker.stats.recent,
                                    self.memory.latest if self.memory is not None else None)
            # a light step's end publishes then too, once there is a run to log into (until then, each
            # publication looks for one)
            tracker.publish_at_step = outputs.next_rows_at if outputs.wandb.run is not None else 1 << 62
        self.published()
        saving = self.saving
        if self.tracker.step >= self.early_answer_at:  # the first answer: the settings' and recipe's verdicts
            self.early_answer_at = 1 << 62
            saving.save(window=False, early=True)
        elif saving.every_ns and monotonic_ns() >= saving.next_ns:  # every report_every_s, the report is rewritten
            saving.save(window=False)
