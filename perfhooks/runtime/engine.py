"""The profiling engine: a small façade that routes training-loop events to the parts of a run.

Integrations translate their framework's hooks into these calls and nothing else: :meth:`Engine.fetch` (a training
batch is asked for: ``data_wait`` starts, a step whose optimizer stepped ends), ``phase_start`` / ``phase_end``
(``data_wait``, ``forward``, ``backward``, ``optimizer``; exclusive), ``stepped`` (an optimizer step), ``aside``
(evaluation or a checkpoint, timed apart), ``idle`` (an epoch ended), ``step_end`` and ``exception``.

The parts, each in its own file (the tracker, :mod:`~perfhooks.runtime.step.tracker`; the capture controller, FLOP
arming, compile tracking, memory, the settings audit, the outputs), are routed at each step's moments by
:class:`~perfhooks.runtime.step_listener.RunParts`. At each step boundary the engine publishes one immutable
:class:`~perfhooks.runtime.state.run_state.RunState` (:attr:`Engine.state`): other threads read that, never the
parts. The run's end is :mod:`~perfhooks.runtime.ending.lifecycle`'s. Every event is guarded: a fault inside
perfhooks is reported once per kind and training goes on. Only :meth:`Engine.close` waits on the GPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from perfhooks.capture.nvtx import NvtxRanges
from perfhooks.config import PerfConfig
from perfhooks.device.clock import DeviceClock, HostClock
from perfhooks.device.describe import installed_version, usable_cpus
from perfhooks.device.room import DeviceRoom
from perfhooks.device.settings import SettingsAudit
from perfhooks.distributed import ranks
from perfhooks.faults import FaultLog, Once, guarded, is_device_error
from perfhooks.files.writer import BackgroundWriter
from perfhooks.memory.monitor import MemoryMonitor
from perfhooks.report.schema import new_run_id
from perfhooks.runtime.capture_control import CaptureControl
from perfhooks.runtime.ending import exit_guard, lifecycle
from perfhooks.runtime.ending.orphans import OwnerWatch
from perfhooks.runtime.hooks import host_batches
from perfhooks.runtime.hooks.torch_hooks import HookHandles, add_module_ranges
from perfhooks.runtime.null_engine import NullEngine
from perfhooks.runtime.state.live_watch import LiveWatch
from perfhooks.runtime.state.outputs import RunOutputs, existing_ancestor
from perfhooks.runtime.state.reporting import build_run_report, report_parts
from perfhooks.runtime.state.run_state import RunFacts, RunState
from perfhooks.runtime.state.saving import ReportSaving
from perfhooks.runtime.step.run_account import RunAccount
from perfhooks.runtime.step.sampling import StepSampler
from perfhooks.runtime.step.timing_reader import TimingReader
from perfhooks.runtime.step.tracker import StepTracker
from perfhooks.runtime.step_listener import RunParts
from perfhooks.runtime.throughput.flop_arming import FlopArming
from perfhooks.runtime.torch_compile import CompileTracking
from perfhooks.sinks.wandb import RunSource
from perfhooks.timebase import monotonic_ns

__all__ = ["Engine", "NullEngine", "RunEngine"]


class Engine:
    """Times phases, annotates them, opens capture windows and writes the report for one run."""

    #: True: this run is profiled (a :class:`NullEngine` is not).
    active = True
    # The hot events are the tracker's own methods, set on each engine as it is built (each guards itself):
    #: The loop asks its loader for a training batch: a step that stepped ends, ``data_wait`` starts.
    fetch: Callable[[], None]
    #: Start phase ``name``: ends the open phase, opens a step if none is open.
    phase_start: Callable[[str], None]
    #: End phase ``name`` if it is the open one (an unmatched end is ignored).
    phase_end: Callable[[str], None]
    #: End the open step (and its open phase); its timings are read once the device is done.
    step_end: Callable[[], None]
    #: A micro-batch of the open step is in hand: its samples and tokens count (shapes only, no device sync).
    batch: Callable[[Any], None]
    #: Host work the framework named (a Lightning callback's hook) took ``ms`` while a training step was open.
    named: Callable[[str, float], None]
    #: The open step stepped an optimizer; ``global_step`` is the framework's counter (else one is added).
    stepped: Callable[..., None]

    def __init__(self, config: PerfConfig, output_dir: str | Path, framework: str,
                 device: torch.device | str | None = None, start_step: int = 0,
                 clock: HostClock | None = None, wandb_source: RunSource | None = None,
                 ends_explicitly: bool = False, global_step: int | None = None) -> None:
        """``start_step``: perfhooks' steps before this run (a resume); ``global_step``: the framework's own counter
        now, when it differs (two optimizers stepping per batch, a checkpoint's loop state one behind).
        ``ends_explicitly``: the framework always sends the run's end (``close``) when it completes, so
        an engine still open when the next run starts or the process exits was a run that failed."""
        self.config = config
        self.ends_explicitly = ends_explicitly
        self.output_dir = Path(output_dir)
        #: The nearest existing folder on the way to ``output_dir``: once the user removes it, nothing is written.
        self.output_anchor = existing_ancestor(self.output_dir)
        self.faults = FaultLog()
        self.once = Once()
        # made now, so that `touch <output_dir>/TRIGGER` works from the first step (a failure: the first write says)
        with contextlib.suppress(OSError):
            self.output_dir.mkdir(parents=True, exist_ok=True)
        #: All device access for this run, bound to its device index.
        self.room = DeviceRoom(device)
        self.facts = RunFacts(framework, ranks.rank(), ranks.world_size(),
                              {**self.room.describe(), "usable_cpus": usable_cpus()}, new_run_id(), time.time(),
                              self.config.device_hour_cost, installed_version(framework))
        self.clock: HostClock = clock or (DeviceClock(self.room) if self.room.timed else HostClock())
        self.writer = BackgroundWriter(self.faults, output_removed=self.output_removed)
        self.hooks = HookHandles()
        self.status = "running"
        self.error: dict[str, Any] | None = None
        #: Print the end-of-run table: off on the exit paths, where the user's traceback must stay the last output.
        self.console = config.console
        self.final_report: dict[str, Any] | None = None
        #: The signal that ended the run, once one arrived (the report says ``terminated``).
        self.signal: str | None = None
        self._closed = False
        self._error_seen: BaseException | None = None
        self.owner = OwnerWatch(lambda: exit_guard.release_signals(self, self.capture.release_signal))  # orphans
        self.on_release: list[Callable[[], None]] = []  # what an integration undoes when the run ends
        self._build_parts(start_step, global_step, wandb_source)
        #: The run as last published (every thread but the training thread reads this, never the parts).
        self.state = self.publish()
        exit_guard.begin(self, config.signals)  # type: ignore[arg-type]
        self.watch.start()
        if isinstance(self.clock, DeviceClock):
            self.timings.start()  # the step timings are read off the training thread
        host_batches.follow(self.tracker.host_batch)  # the batches on the host, before a framework moves them

    def _build_parts(self, start_step: int, global_step: int | None, wandb_source: RunSource | None) -> None:
        config, facts = self.config, self.facts
        account = RunAccount(monotonic_ns if self.clock.device_timed else self.clock.mark)
        self.tracker = StepTracker(self.clock, account, NvtxRanges(enabled=config.nvtx), self.faults,
                                   start_step=start_step, global_step=global_step,
                                   sampler=StepSampler(config.overhead_budget))
        # the hot path: these events go straight to the tracker (each guards itself), without a frame of the engine's
        tracker = self.tracker
        self.phase_start, self.phase_end, self.step_end, self.batch, self.fetch, self.stepped, self.named = (
            tracker.phase_start, tracker.phase_end, tracker.step_end, tracker.batch, tracker.fetch, tracker.stepped,
            tracker.named)
        self.capture = CaptureControl(config, output_dir=self.output_dir, rank=facts.rank,
                                      world_size=facts.world_size, cuda=self.room.is_cuda, writer=self.writer,
                                      faults=self.faults, once=self.once, current_step=lambda: self.tracker.step,
                                      on_saved=lambda: self.saving.window_saved(),
                                      on_written=(lambda path, window: self.saving.window_written(path, window))
                                      if config.analyze_windows else None)
        # built after the tracker: the all-ranks trigger's thread reads the tracker's step from its first poll
        tracker.end_step_label = self.capture.windows.end_step_label  # closes ProfilerStep#N (one frame)
        self.memory: MemoryMonitor | None = self._start_memory() if config.memory else None
        if self.memory is not None:
            shapes = self.tracker.batches.shapes
            self.memory.shapes_seen = shapes.__len__  # the batch shapes the detailed steps saw
        self.flops = FlopArming(config, self.faults)
        self.compile = CompileTracking(self.tracker, self.faults)
        self.outputs = RunOutputs(config, facts.rank, self.output_dir, wandb_source, self.faults, self.once,
                                  start_step)
        self.saving = ReportSaving(self.output_dir, config.report_every_s, config.thresholds, self.writer,  # type: ignore[arg-type]
                                   self.capture, self.outputs, self.faults, self.publish, self.build_report,
                                   lifecycle.write_report, on_verdicts=tracker.publish_soon)
        self.watch = LiveWatch(rank=facts.rank, world_size=facts.world_size, output_dir=self.output_dir,
                               stall_after_s=config.stall_after_s, console_every_s=config.console_every_s,  # type: ignore[arg-type]
                               state=lambda: self.state, phase_now=lambda: self.tracker.phase_now,
                               trace=lambda: self.saving.trace,  # a window's verdicts, as soon as analysed
                               device=self.room.queue_state, on_stall=self._stalled, faults=self.faults,
                               left_open=lambda idle_s, limit_s: self.owner.left_open(
                                   idle_s, limit_s, self.error is not None, self.output_removed()),
                               on_left_open=lambda reason: lifecycle.left_open(self, reason))
        self.timings = TimingReader(self.tracker.pending, self.faults)  # started for a device clock only
        #: The parts, routed at each step's moments (the tracker's listener).
        self.parts = RunParts(self.tracker, self.capture, self.memory, self.flops, self.compile, self.outputs,
                              self.writer, self.faults, self.publish, self.saving, self.hooks)
        self.room.when_lost(self.parts.device_lost)  # a CUDA error, wherever perfhooks met it first
        audit = lambda: SettingsAudit(self.room, workers=host_batches.most_workers)  # noqa: E731  (read now)
        self.parts.settings = self.faults.call("settings_audit", audit)

    def _start_memory(self) -> MemoryMonitor | None:
        config = self.config
        try:
            return MemoryMonitor(
                self.output_dir, self.room, self.faults, self.once, threshold=config.memory_threshold,
                capacity_bytes=config.memory_capacity_bytes, poll_s=config.memory_poll_s,
                history=config.memory_history, history_entries=config.memory_history_entries,
                max_captures=config.max_memory_captures, arm_fraction=config.memory_arm_fraction,
                submit=self.writer.submit)
        except Exception as error:
            self.faults.report("memory_start", error)
            return None

    @classmethod
    def start(cls, config: PerfConfig, output_dir: str | Path, framework: str, **kwargs: Any) -> Engine | NullEngine:
        """Build an engine for an integration; on a fault, warn once and return a :class:`NullEngine`."""
        try:
            return cls(config, output_dir, framework, **kwargs)
        except Exception as error:
            null = NullEngine()
            null.faults.report("engine_start", error)
            return null

    step = property(lambda self: self.tracker.step)
    global_step = property(lambda self: self.tracker.global_step)
    stats = property(lambda self: self.tracker.stats)
    pending = property(lambda self: self.tracker.pending)
    account = property(lambda self: self.tracker.account)
    windows = property(lambda self: self.capture.windows)
    all_ranks = property(lambda self: self.capture.all_ranks)
    closed = property(lambda self: self._closed)

    cuda_broken = property(lambda self: self.parts.device_broken)  # a CUDA error ended the run: no CUDA call now
    open_phase = property(lambda self: self.tracker.open_phase)  # the phase open now, if any
    window_open = property(lambda self: self.capture.is_open)  # a capture window records (or warms up) now

    def output_removed(self) -> bool:
        """The folder the output goes in existed at the start and the user has removed it since."""
        return self.output_anchor is not None and not self.output_anchor.exists()

    def defer_windows_to(self, owner: str) -> None:
        """Another ``torch.profiler`` user is configured (e.g. Lightning's PyTorchProfiler): open no window."""
        self.capture.defer_to(owner)

    # ----------------------------------------------------------------- events (training thread)
    @guarded("step_start")
    def step_start(self) -> None:
        if not self.tracker.step_open and not self._closed:
            self.tracker.open_step()

    @guarded("fetched")
    def fetched(self, batches: int) -> None:
        """The fetch that just ended took ``batches`` micro-batches at once (transformers' prefetch of a step)."""
        self.tracker.fetched(batches)

    def set_hook_timing(self, on: bool) -> None:
        """Whether the step opening now times the framework's named hooks (:meth:`named`; one step in several)."""
        self.tracker.naming = on

    @guarded("idle")
    def idle(self) -> None:
        """Time from now until the next phase belongs to no step (an epoch's end, the loader ran out)."""
        self.tracker.idle()

    @guarded("aside")
    def aside_start(self, kind: str) -> None:
        """Evaluation or a checkpoint write starts: timed apart, out of the open step and its ``ProfilerStep``."""
        self.tracker.aside_start(kind)

    @guarded("aside")
    def aside_end(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) ends; an unmatched end is ignored."""
        self.tracker.aside_end(kind)

    @guarded("aside")
    def aside_cancel(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) was not one: it is neither counted nor timed."""
        self.tracker.aside_cancel(kind)

    @contextlib.contextmanager
    def aside(self, kind: str) -> Iterator[None]:
        """``with engine.aside("checkpoint"): ...``: the user's errors pass through untouched."""
        self.aside_start(kind)
        try:
            yield
        finally:
            self.aside_end(kind)

    def note_flops(self, per_step: float, source: str) -> None:  # the framework's count (unless the user gave one)
        self.flops.note_flops(per_step, source)

    def note_precision(self, dtype: str, source: str, ran: bool = False) -> None:
        """The run's matmul dtype (``bf16``, ``fp16``, ``fp8``, ``tf32``, ``fp32``) from the framework's setting,
        or (``ran``) from what a step ran in (autocast at the forward), which no setting overrides."""
        self.flops.note_precision(dtype, source, ran)

    def note_recipe(self, read: Callable[[], dict[str, Any]]) -> None:
        """The recipe ``read()`` gives (:mod:`perfhooks.integrations.recipe`; guarded), added to any earlier one."""
        recipe = self.faults.call("recipe", read)
        self.parts.recipe = {**(self.parts.recipe or {}), **recipe} if isinstance(recipe, dict) else self.parts.recipe

    @guarded("watch_model")
    def watch_model(self, model: torch.nn.Module) -> None:
        """The model whose parameters the memory census attributes; per-module NVTX ranges when asked."""
        if self.memory is not None:
            self.memory.models.append(model)
        self.watch_optimizer(model)  # the settings audit watches models and optimizers alike
        if self.flops.watch_compiled(model, self.hooks.add):  # a compiled model's FLOPs: counted on meta tensors
            self.compile.model_compiled = True
        if self.config.module_ranges:
            add_module_ranges(model, self.tracker.nvtx, self.hooks)
            if self.compile.model_compiled:
                self.once.warn("module_ranges_compiled", "module_ranges: no NVTX range exists inside a torch.compile "
                               "region; the ranges of compiled modules' submodules are not recorded")

    def watch_optimizer(self, optimizer: Any) -> None:
        """An optimizer (or a model) the run trains, for the settings audit (``foreach``, the parameters' dtype)."""
        self.faults.call("watch_optimizer", lambda: self.parts.settings and self.parts.settings.watch(optimizer))

    compiled_in_run = property(lambda self: self.compile.compiled_in_run)  # torch.compile compiled since the start

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.step = int(state.get("step", self.step))

    # ----------------------------------------------------------------- the published state
    def publish(self, full: bool = False) -> RunState:
        """Publish the run's state now (training thread): the steps and phase fresh, the report's slower parts
        taken anew when ``full`` (a window's end, the close), else carried from the last full publication."""
        tracker = self.tracker
        parts = (report_parts(self.parts, self.facts.device, self.room.is_cuda, self.error, self.saving.trace)
                 if full or not hasattr(self, "state") else self.state.parts)
        if parts.trace is not self.saving.trace:  # a window's analysis ended since: its verdicts at once
            parts = parts._replace(trace=self.saving.trace)
        phase, since, _ = tracker.phase_now  # the open phase and when it started (one read: they agree)
        sampler = tracker.sampler
        state = RunState(tracker.step, tracker.global_step, self.status, phase, since if phase is not None else None,
                         monotonic_ns() / 1e9, tracker.stats.snapshot(), parts, self.signal,
                         sampler.live_share())
        self.state = state
        return state

    def build_report(self, state: RunState) -> dict[str, Any]:
        """The report of ``state`` (any thread)."""
        return build_run_report(state, self.facts, self.config.thresholds, self.config.peak_flops, self.faults,
                                self.watch.records())

    def report(self) -> dict[str, Any]:
        """The report now (training thread: publishes first)."""
        return self.build_report(self.publish(full=True))

    # ----------------------------------------------------------------- the run's end (lifecycle)
    def close(self, deadline_s: float | None = None) -> dict[str, Any] | None:
        """End of training (once): the report, the table, every resource released (``lifecycle.close``).

        ``deadline_s`` bounds the waits (writer, W&B, other ranks) in total. A run a signal was to end but whose
        program let it go on to its normal end completed: the report says so, and names the signal survived.
        """
        if self.status == "terminated" and not self._closed:
            self.status = "completed"
        return lifecycle.close(self, deadline_s)

    def terminated(self, name: str, busy: bool, helper: Any) -> None:
        """A signal that ends the run arrived, in perfhooks' handler: no lock taken (``lifecycle.terminate``)."""
        lifecycle.terminate(self, name, busy, helper)

    def exception(self, error: BaseException, deadline_s: float | None = None, quiet: bool = False) -> None:
        """The user's error is on its way out: the run closes as ``failed`` (``lifecycle.fail``). Never raises."""
        lifecycle.fail(self, error, deadline_s, quiet)

    def abandon(self, deadline_s: float | None = None, quiet: bool = False, superseded: bool = False) -> None:
        """The run ended without its end event: close it (``lifecycle.abandon``)."""
        lifecycle.abandon(self, deadline_s, quiet, superseded)

    def training_ended(self) -> None:
        """The framework's training loop ended (its end hook); the close comes later (after its other end hooks):
        the last step ends here and the run's wall clock stops."""
        try:
            if not self._closed:
                self.end_open_step()
                self.tracker.account.close()
        except Exception as error:
            self.faults.report("training_ended", error)

    def end_open_step(self) -> None:
        """At close: end an aside cut short, count a last step that stepped, drop one cut short."""
        self.parts.stop_flop_count(keep=self.status != "failed")
        self.tracker.end_open_step(count_last=not self.cuda_broken)

    def note_error(self, error: BaseException) -> None:
        """An error passed through a wrapper of perfhooks' (the caller may yet catch it): remember it for the
        report and, when it is an OOM, write the dump now, while memory is as the error left it."""
        try:
            if self._closed or error is self._error_seen:
                return
            self._error_seen = error
            self.parts.stop_flop_count(keep=False)
            phase = self.open_phase
            self.error = lifecycle.error_entry(error, self.owner.step(self.step), phase)  # the framework's count
            if is_device_error(error):  # the room's callback stops the parts' device use
                self.room.lose(f"{type(error).__name__}: {error}")
            elif self.memory is not None:
                self.memory.on_exception(error, self.step, phase)
        except Exception as fault:
            self.faults.report("exception", fault)

    def begin_close(self) -> bool:
        """The close starts: True the first time (the run is marked closed and, when still running, completed)."""
        if self._closed:
            return False
        self._closed = True
        self.tracker.stop()
        if self.status == "running":
            self.status = "completed"
        return True

    def settle(self, device_deadline: float, writer_timeout_s: float) -> None:
        """The close's first pass: the open step ends and the run's clock stops; the device gets until
        ``device_deadline`` (``time.monotonic()``) to finish its queued work (``query()`` polled, never a blocking
        sync), then the window stops and pending timings are read; hooks, triggers and the writer end."""
        self.faults.call("close_step", self.end_open_step)
        self.tracker.account.close()
        self.timings.stop()  # the close reads what is left, on this thread
        if not self.cuda_broken:
            lifecycle.settle_device(self.capture, self.tracker, self.room, device_deadline, self.once, self.faults)
        else:  # no device call: the window is let go of (a CPU-only one is stopped)
            self.faults.call("window_abandon", self.capture.windows.abandon)
        self.hooks.remove()
        self.watch.close()
        self.capture.stop_triggers()
        self.faults.call("trigger_unreached", lambda: self.capture.unreached(self.step))
        self.writer.close(writer_timeout_s)

    def stop_window(self, device_deadline: float) -> Any:
        """A signal: stop the open window, no lock taken; the job that exports its partial trace, or None."""
        return lifecycle.stop_window_for_signal(self.capture, self.saving, self.room, device_deadline,
                                                self.parts.device_broken)

    def _stalled(self) -> None:
        self.saving.write_now(self.state)  # a stall opened or ended (the watch's thread): the report now, W&B
        self.outputs.stalled(self.watch.records())

    def last_live(self, state: RunState) -> None:
        """The live file's last frame, with the run's final status (the watch has stopped)."""
        self.watch.write_live(state, None, 0.0, self.watch.clock())

    def stop_memory(self) -> None:
        """End of training: stop the allocation history perfhooks started."""
        if self.memory is not None and not self.cuda_broken:
            self.faults.call("memory_stop", self.memory.stop)

    def release(self) -> None:
        """Let go of everything that refers to the user's objects and of process-wide state."""
        try:
            self.hooks.remove()
            self.watch.close()
            self.timings.stop()
            self.compile.remove()
            if self.memory is not None:
                self.memory.release()
            self.outputs.release()
            self.room.release()
            host_batches.let_go(self.tracker.host_batch)
            while self.on_release:
                self.on_release.pop()()
            self._error_seen = None
        except Exception as error:
            self.faults.report("release", error)
        finally:
            exit_guard.end(self)


#: What an integration holds: a live engine, or the null one.
RunEngine = Engine | NullEngine

