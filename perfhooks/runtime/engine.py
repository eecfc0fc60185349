"""The profiling engine: a small state machine fed by training-loop events.

Integrations translate their framework's hooks into these calls and nothing else:

- :meth:`Engine.fetch`: the loop asks its loader for a training batch (``data_wait`` starts; a
  step whose optimizer stepped ends here, so callbacks and logging after the optimizer are
  that step's ``other``);
- :meth:`Engine.phase_start` / :meth:`Engine.phase_end`: ``data_wait``, ``forward``,
  ``backward``, ``optimizer`` (exclusive: starting one ends the one open);
- :meth:`Engine.stepped`: the framework counted an optimizer step (with its own counter);
- :meth:`Engine.aside`: evaluation or a checkpoint write, timed apart and taken out of any step;
- :meth:`Engine.idle`: an epoch ended (ends a step that stepped);
- :meth:`Engine.step_end`: end the open step now (loops that know their step boundary);
- :meth:`Engine.exception`: the user's error is on its way out; save what we have.

Every event is guarded: a fault inside perfhooks is reported once per kind and training goes
on. Nothing here synchronizes the host with the GPU except :meth:`Engine.close`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.autograd.profiler as autograd_profiler

from perfhooks.capture.all_ranks import AllRanksTrigger, next_run
from perfhooks.capture.labels import ProfilerLabels
from perfhooks.capture.nvtx import NvtxRanges
from perfhooks.capture.schedule import Action, OnDemandWindow
from perfhooks.capture.trigger import OnDemandTrigger
from perfhooks.capture.window_job import analyze_window
from perfhooks.capture.windows import CaptureWindows, WindowSettings
from perfhooks.config import PerfConfig
from perfhooks.device import cuda_extras
from perfhooks.device.clock import DeviceClock, HostClock
from perfhooks.device.room import DeviceRoom
from perfhooks.events import ASIDES, COMPILING, DATA_WAIT, FORWARD, OPTIMIZER, PHASES
from perfhooks.faults import FaultLog, Once, guarded
from perfhooks.memory.monitor import MemoryMonitor
from perfhooks.report import store as rank_store
from perfhooks.report.build import build_report
from perfhooks.report.schema import new_run_id
from perfhooks.report.statistics import PhaseStatistics
from perfhooks.report.throughput import throughput_section
from perfhooks.report.worker import BackgroundWriter
from perfhooks.report.write import write_report
from perfhooks.rules.compile import diagnose_compile
from perfhooks.rules.live import diagnose_live
from perfhooks.rules.reconcile import reconcile
from perfhooks.rules.verdicts import rank
from perfhooks.runtime import flops as flops_sources
from perfhooks.runtime import lifecycle, ranks
from perfhooks.runtime.batches import count_batch
from perfhooks.runtime.compile_watch import CompileWatch
from perfhooks.runtime.flops import FlopMeter
from perfhooks.runtime.run_account import RunAccount
from perfhooks.runtime.steps import PendingSteps, StepRecord
from perfhooks.runtime.torch_hooks import HookHandles, add_module_ranges
from perfhooks.sinks.wandb import RunSource, WandbSink

_PHASE_NAMES = frozenset(PHASES)
#: Names kept in ``Engine.named_work`` (a framework names a fixed set of hooks; this bounds a pathological one).
MAX_NAMED_WORK = 256


class Engine:
    """Times phases, annotates them, opens capture windows and writes the report for one run."""

    def __init__(self, config: PerfConfig, output_dir: str | Path, framework: str,
                 device: torch.device | str | None = None, start_step: int = 0,
                 clock: HostClock | None = None, wandb_source: RunSource | None = None,
                 ends_explicitly: bool = False, global_step: int | None = None) -> None:
        """``start_step``: perfhooks' steps before this run (a resume); ``global_step``: the framework's own counter
        now, when it differs (two optimizers stepping per batch, a checkpoint's loop state one behind).
        ``ends_explicitly``: the framework always sends the run's end (``close``) when it completes, so
        an engine still open when the next run starts or the process exits was a run that failed."""
        self.config = config
        self.run_id = new_run_id()
        self.started_at = time.time()
        self.ends_explicitly = ends_explicitly
        self.output_dir = Path(output_dir)
        #: The nearest folder on the way to ``output_dir`` that exists now: if the user removes it (a
        #: ``TemporaryDirectory`` left), perfhooks writes nowhere rather than make it again.
        self.output_anchor = _existing_ancestor(self.output_dir)
        self.framework = framework
        self.faults = FaultLog()
        self.once = Once()
        # made now, so that `touch <output_dir>/TRIGGER` works from the first step; a folder that can't be made
        # is reported once, by the first write that needs it
        with contextlib.suppress(OSError):
            self.output_dir.mkdir(parents=True, exist_ok=True)
        self.step = start_step
        #: The framework's own step counter (Lightning ``global_step``, transformers ``state.global_step``,
        #: or the optimizer steps counted here); W&B rows and the report use it.
        self.global_step = start_step if global_step is None else global_step
        self.rank = ranks.rank()
        self.world_size = ranks.world_size()
        #: All device access for this run, bound to its device index.
        self.room = DeviceRoom(device)
        self.device = self.room.describe()
        on_cuda = self.room.is_cuda
        self.clock: HostClock = clock or (DeviceClock(self.room) if self.room.timed else HostClock())
        self.account = RunAccount(time.perf_counter_ns if self.clock.device_timed else self.clock.mark)
        #: Host work the framework named while a step was open (a Lightning callback's hooks): name -> ms in all.
        self.named_work: dict[str, float] = {}
        self.stats = PhaseStatistics()
        self.pending = PendingSteps(self.clock)
        self.nvtx = NvtxRanges(enabled=config.nvtx)
        self._nvtx_on = self.nvtx.active
        self.labels = ProfilerLabels()
        self.writer = BackgroundWriter(self.faults)
        self.hooks = HookHandles()
        if config.nsys_capture and not on_cuda:
            self.once.warn("nsys_cpu", "nsys_capture needs CUDA; it is off for this run")
        self.windows = CaptureWindows(
            self.output_dir / "traces", self.rank, self.world_size, self.action, WindowSettings(
                record_shapes=config.record_shapes, profile_memory=config.profile_memory,
                with_stack=config.with_stack, cuda=on_cuda,
                nsys_capture=config.nsys_capture, max_traces=config.max_traces,
                max_trace_bytes=config.max_trace_bytes),
            self.writer, self.faults, self.once, on_saved=self._save_report_async,
            on_written=self._on_window_written if config.analyze_windows else None)
        self.trigger = OnDemandTrigger(self.output_dir, config.trigger_poll_s) if config.on_demand else None
        #: With a process group of 2 or more ranks: the trigger that opens a window on every rank (else None).
        self.all_ranks: AllRanksTrigger | None = None
        if self.trigger is not None and self.world_size > 1:
            self.all_ranks = self._all_ranks_trigger(self.trigger)
        self.memory: MemoryMonitor | None = None
        if config.memory:
            try:
                self.memory = MemoryMonitor(
                    self.output_dir, self.room, self.faults, self.once, threshold=config.memory_threshold,
                    capacity_bytes=config.memory_capacity_bytes, poll_s=config.memory_poll_s,
                    history=config.memory_history, history_entries=config.memory_history_entries,
                    max_captures=config.max_memory_captures, arm_fraction=config.memory_arm_fraction,
                    submit=self.writer.submit)
            except Exception as error:
                self.faults.report("memory_start", error)
        #: Tag CUDA allocations with the phase (``_set_memory_metadata``) while an allocation history records.
        self._tag_allocations = self.memory is not None and self.memory.cuda and cuda_extras.tags_supported()
        self.wandb: WandbSink | None = None
        if config.wandb is not False and ranks.logs_to_trackers(self.rank):
            self.wandb = WandbSink(source=wandb_source or RunSource(), explicit_run=config.wandb_run,
                                   open_if_missing=config.wandb is True, queue=config.wandb_queue,
                                   output_dir=self.output_dir, faults=self.faults, once=self.once)
        self._next_wandb_step = start_step + config.wandb_log_every
        #: Diagnoses from the latest analysed window (trace rules); live rules are added at report time.
        self.trace_diagnoses: list[dict[str, Any]] = []
        self.trace_window_steps: int | None = None
        self.status = "running"
        self.error: dict[str, Any] | None = None
        self._error_seen: BaseException | None = None
        #: A CUDA error ended the run: no CUDA call from here on (the context may be broken).
        self.cuda_broken = False
        #: Print the end-of-run table: off on the exit paths, where the user's traceback must stay the last output.
        self.console = config.console
        self.final_report: dict[str, Any] | None = None
        self._on_demand: OnDemandWindow | None = None
        self._record: StepRecord | None = None
        self._phase: tuple[str, Any] | None = None
        self._windows_at: int | None = None
        self._aside_mark: tuple[str, Any] | None = None  # the outermost aside inside the open step
        self._aside_labels: list[Any] = []
        self._writer_seen = 0
        self._captures_seen = 0
        self._compiles_at_start = compiled_graphs()
        self._thread = threading.get_ident()
        #: The phase a compilation interrupted (resumed when it ends), and the steps that compiled.
        self._compile_resume: str | None = None
        self.compile_steps: list[int] = []
        #: Throughput and FLOPs: the token count's source, the framework's count and matmul dtype (their hints),
        #: and the one-step FLOPs measurement (armed for the first window's warm-up step).
        self.token_source: str | None = None
        self.framework_flops: tuple[float, str] | None = None
        #: A step's FLOPs may still be measured in this run (nothing the user set gives the count):
        #: ``expect_framework_flops`` and a measurement, taken or skipped, turn it off.
        self._may_count_flops = config.count_flops and not (config.flops_per_step or config.flops_per_sample)
        #: A watched model is torch.compile'd (or graphs compiled during the run): no dispatch mode is entered.
        self.model_compiled = False
        self.precision: tuple[str, str] | None = None
        self.flop_meter = FlopMeter()
        self._flops_armed = False
        self._flops_watch = False  # armed or counting: phase_start looks at the meter only then
        self.compile_watch = CompileWatch(self._compile_started, self._compile_ended)
        self.compile_watch.maybe_install()
        self._closed = False
        lifecycle.begin(self)

    #: True: this run is profiled (a :class:`NullEngine` is not).
    active = True

    def output_removed(self) -> bool:
        """The folder the output goes in existed at the start and the user has removed it since."""
        return self.output_anchor is not None and not self.output_anchor.exists()

    @classmethod
    def start(cls, config: PerfConfig, output_dir: str | Path, framework: str, **kwargs: Any) -> Engine | NullEngine:
        """Build an engine for an integration; on a fault, warn once and return a :class:`NullEngine` (training
        goes on, unprofiled)."""
        try:
            return cls(config, output_dir, framework, **kwargs)
        except Exception as error:
            null = NullEngine()
            null.faults.report("engine_start", error)
            return null

    def defer_windows_to(self, owner: str) -> None:
        """Another ``torch.profiler`` user is configured (e.g. Lightning's PyTorchProfiler): open no window."""
        self.windows.defer_to(owner)

    def _all_ranks_trigger(self, local: OnDemandTrigger) -> AllRanksTrigger | None:
        """Start the watcher thread that shares on-demand windows through the process group's store."""
        try:
            store = rank_store.default_store()
            if store is None:
                return None
            schedule = self.config.schedule

            def is_free(step: int) -> bool:
                return schedule is None or schedule(step) is Action.NONE

            watcher = AllRanksTrigger(store, next_run(), self.rank, local, self.config.trigger_poll_s,
                                      lambda: self.step, 1 + self.config.on_demand_active, is_free, self.once)
            watcher.start()
            return watcher
        except Exception as error:
            self.faults.report("trigger_store", error)
            return None

    # ----------------------------------------------------------------- schedule
    def action(self, step: int) -> Action:
        """The capture action at ``step``: an on-demand window first, then the schedule (pure in the step)."""
        if self._on_demand is not None:
            action = self._on_demand(step)
            if action is not Action.NONE:
                return action
        schedule = self.config.schedule
        return schedule(step) if schedule is not None else Action.NONE

    # ----------------------------------------------------------------- events
    @guarded("step_start")
    def step_start(self) -> None:
        if self._record is None and not self._closed:
            self._open_step()

    def _open_step(self) -> None:
        step = self.step
        if self._windows_at != step:  # a step discarded by idle() has driven the windows already
            self._windows_at = step
            self._drive_windows(step)
        self.account.started()
        if not self.compile_watch.installed:
            self.compile_watch.maybe_install()
        if self.memory is not None and not self.cuda_broken:
            try:
                self.memory.observe_step_start(step)
            except Exception as error:
                self.faults.report("memory_sample", error)
        if self._flops_watch:
            self._stop_counting()
        elif self._may_count_flops:
            self._arm_flop_count(step)
        record = StepRecord(step, self.clock.mark())
        writer = self.writer
        record.own = self.windows.is_open or writer.running
        self._writer_seen = writer.started
        self._record = record

    def fetch(self) -> None:
        """The loop asks its loader for a training batch: a step that stepped ends, ``data_wait`` starts."""
        try:
            if self._closed:
                return
            record = self._record
            if record is not None and record.stepped:
                self.step_end()
            self.phase_start(DATA_WAIT)
        except Exception as error:
            self.faults.report("fetch", error)

    def fetched(self, batches: int) -> None:
        """The fetch that just ended took ``batches`` micro-batches at once (transformers' prefetch of a step)."""
        try:
            record = self._record
            if record is not None and batches > 1:
                record.micro_batches += batches - 1
        except Exception as error:
            self.faults.report("fetched", error)

    def batch(self, batch: Any) -> None:
        """A micro-batch of the open step is in hand: its samples and tokens count (shapes only, no device sync)."""
        try:
            record = self._record
            if record is None or self._closed:
                return
            counted = count_batch(batch)
            if counted is None:
                return
            record.samples += counted.samples
            record.tokens += counted.tokens
            if counted.token_source is not None:
                self.token_source = counted.token_source
        except Exception as error:
            self.faults.report("batch", error)

    def named(self, name: str, ms: float) -> None:
        """Host work the framework named (a Lightning callback's hook, ``Name.hook``) took ``ms`` while a training
        step was open (not in an evaluation or a checkpoint write): who ran in ``other`` and the phases."""
        try:
            if self._record is None or self.account.innermost is not None:
                return
            work = self.named_work
            if name in work or len(work) < MAX_NAMED_WORK:
                work[name] = work.get(name, 0.0) + ms
        except Exception as error:
            self.faults.report("named", error)

    def named_work_per_step(self) -> dict[str, float]:
        """The largest named work, ms per step over every step (the 10 largest)."""
        steps = max(self.stats.steps, 1)
        ranked = sorted(self.named_work.items(), key=lambda item: -item[1])[:10]
        return {name: round(ms / steps, 4) for name, ms in ranked}

    def note_flops(self, per_step: float, source: str) -> None:
        """The framework's own count of one step's training FLOPs (used unless the user gave one)."""
        if per_step > 0:
            self.framework_flops = (float(per_step), source)

    def note_precision(self, dtype: str, source: str) -> None:
        """The run's matmul dtype (``bf16``, ``fp16``, ``fp8``, ``tf32``, ``fp32``) from the framework's setting."""
        self.precision = (dtype, source)

    def expect_framework_flops(self) -> None:
        """The framework counts FLOPs itself and will say so (``note_flops``): no step is measured."""
        self._may_count_flops = False

    def _arm_flop_count(self, step: int) -> None:
        """Count this step's FLOPs if it is the first window's warm-up step (once per run)."""
        if self.action(step) is not Action.WARMUP:
            return
        self._may_count_flops = False
        if self.model_compiled or self.compiled_in_run():
            self.flop_meter.skipped = ("the model is torch.compile'd (counting would recompile its graphs); pass "
                                       "flops_per_step")
            return
        self._flops_armed = self._flops_watch = True

    def _watch_flops(self, phase: str) -> None:
        if self._flops_armed and phase == FORWARD:
            self._flops_armed = False
            self.flop_meter.start(self.step)
        elif phase == OPTIMIZER and self.flop_meter.counting:
            self._stop_counting()

    def _stop_counting(self, keep: bool = True) -> None:
        self._flops_armed = self._flops_watch = False
        try:
            self.flop_meter.stop(keep)
        except Exception as error:
            self.faults.report("flop_count", error)
        meter = self.flop_meter
        if meter.flops_per_step is None and meter.skipped is None:  # cut short: the next window's warm-up tries
            self._may_count_flops = True

    def flops(self) -> dict[str, Any]:
        """FLOPs per step and their source: the user's, the framework's, the measured step's; else why none."""
        config = self.config
        if config.flops_per_step:
            return {"per_step": float(config.flops_per_step), "source": flops_sources.USER_STEP}
        if config.flops_per_sample:
            samples = self.stats.samples / self.stats.steps if self.stats.steps and self.stats.samples else 0
            if samples:
                return {"per_step": config.flops_per_sample * samples, "source": flops_sources.USER_SAMPLE}
            return {"missing": "flops_per_sample was given but no batch's samples were seen"}
        if self.framework_flops is not None:
            return {"per_step": self.framework_flops[0], "source": self.framework_flops[1]}
        meter = self.flop_meter
        if meter.flops_per_step is not None:
            return {"per_step": meter.flops_per_step, "source": f"{flops_sources.COUNTER} (step {meter.step})"}
        if meter.skipped:
            return {"missing": meter.skipped}
        if not config.count_flops:
            return {"missing": "count_flops=False and no flops_per_step or flops_per_sample given"}
        return {"missing": "no capture window's warm-up step ran to measure one (the schedule); pass flops_per_step"}

    def matmul_dtype(self) -> tuple[str, str]:
        """The dtype whose peak applies: the framework's precision, else TF32 where float32 matmuls may use it on
        CUDA, else FP32."""
        if self.precision is not None:
            return self.precision
        if self.room.is_cuda and torch.get_float32_matmul_precision() != "highest":
            return "tf32", f"torch.get_float32_matmul_precision() is {torch.get_float32_matmul_precision()!r}"
        return "fp32", "no mixed precision setting seen"

    def throughput(self, diagnoses: list[dict[str, Any]], windows: list[dict[str, Any]]) -> dict[str, Any]:
        """The report's ``throughput`` section; ``windows``: the report's window records (the latest analysed one
        gives the GPU busy share)."""
        analysed = [w["metrics"] for w in windows if w.get("metrics")]
        return throughput_section(self.stats, self.flops(), self.device, self.matmul_dtype(), self.config.peak_flops,
                                  analysed[-1] if analysed else None, diagnoses, self.token_source)

    def stepped(self, global_step: int | None = None) -> None:
        """The open step stepped an optimizer; ``global_step`` is the framework's counter (else one is added)."""
        try:
            record = self._record
            if record is None or self._closed:
                return
            record.stepped = True
            self.global_step = global_step if global_step is not None else self.global_step + 1
            record.global_step = self.global_step
        except Exception as error:
            self.faults.report("stepped", error)

    # The four events below run several times per step: the fault guard is inlined (no wrapper
    # frame) and NVTX/label calls are skipped when neither is on.
    def phase_start(self, name: str) -> None:
        """Start phase ``name``: ends the open phase, opens a step if none is open."""
        try:
            if self._closed:
                return
            if name not in _PHASE_NAMES:
                raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
            record = self._record
            if record is None:
                self._open_step()
                record = self._record
                mark = record.start
            elif self._phase is not None:
                if self._phase[0] == name:
                    return
                mark = self._close_phase()
            else:
                mark = self.clock.mark()
            if name == DATA_WAIT:  # each fetch is one micro-batch (see fetched() for loaders that take several)
                record.micro_batches += 1
            if self._flops_watch:
                self._watch_flops(name)
            if self._nvtx_on:
                self.nvtx.push(name)
            if autograd_profiler._is_profiler_enabled:
                self.labels.enter(name)
            if self._tag_allocations and self.memory.history:  # type: ignore[union-attr]
                cuda_extras.tag_allocations(name)  # the snapshot shows each allocation's phase
            self._phase = (name, mark)
        except Exception as error:
            self.faults.report("phase_start", error)

    def phase_end(self, name: str) -> None:
        """End phase ``name`` if it is the open one (an unmatched end is ignored)."""
        try:
            if self._phase is not None and self._phase[0] == name:
                self._close_phase()
        except Exception as error:
            self.faults.report("phase_end", error)

    def step_end(self) -> None:
        """End the open step (and its open phase); its timings are read once the device is done."""
        try:
            record = self._record
            if record is None:
                return
            record.end = self._close_phase() if self._phase is not None else self.clock.mark()
            self.windows.end_step_label()
            self._record = None
            if record.global_step is None:
                record.global_step = self.global_step
            record.micro_batches = max(1, record.micro_batches)  # a loop that reports no fetch: one batch
            writer = self.writer
            if writer.running or writer.started != self._writer_seen:
                record.own = True
            self.step += 1
            self.pending.push(record)
            self.pending.drain(self.stats)
            if self.wandb is not None and self.step >= self._next_wandb_step:
                self._next_wandb_step = self.step + self.config.wandb_log_every
                self.wandb.log_steps(self.global_step, list(self.stats.recent)[-self.config.wandb_log_every:],
                                     self.memory.latest if self.memory is not None else None)
        except Exception as error:
            self.faults.report("step_end", error)

    @guarded("idle")
    def idle(self) -> None:
        """Time from now until the next phase belongs to no step (an epoch's end, the loader ran out)."""
        if self._phase is not None:
            self._close_phase()
        record = self._record
        if record is None:
            return
        if record.stepped:
            self.step_end()
        elif all(name == DATA_WAIT for name, _, _ in record.intervals):
            self._drop_record()  # only waited so far: that wait was not for a training batch

    def begin_aside(self, kind: str) -> None:
        """Evaluation or a checkpoint write starts: timed apart, out of the open step and its ``ProfilerStep``."""
        try:
            if self._closed:
                return
            if kind not in ASIDES:
                raise ValueError(f"unknown aside {kind!r}; asides are {', '.join(sorted(ASIDES))}")
            if self._flops_watch and kind != COMPILING:
                self._stop_counting(keep=False)  # evaluation inside the counted step: no count, not a wrong one
            if self._phase is not None:
                self._close_phase()
            self.windows.end_step_label()
            if self.account.depth == 0 and self._record is not None:
                self._aside_mark = (kind, self.clock.mark())
            self.account.begin(kind)
            if self._nvtx_on:
                self.nvtx.push(kind)
            label = None
            if autograd_profiler._is_profiler_enabled:
                label = autograd_profiler.record_function(kind)
                label.__enter__()
            self._aside_labels.append(label)
        except Exception as error:
            self.faults.report("aside", error)

    def end_aside(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) ends; an unmatched end is ignored."""
        try:
            if not self.account.end(kind):
                return
            self._pop_aside_annotations()
            if self.account.depth == 0 and self._aside_mark is not None:
                outer, start = self._aside_mark
                self._aside_mark = None
                if self._record is not None:
                    self._record.intervals.append((outer, start, self.clock.mark()))
        except Exception as error:
            self.faults.report("aside", error)

    def retract_aside(self, kind: str) -> None:
        """The aside ``kind`` (the innermost open one) was not one: it is neither counted nor timed, and what
        follows belongs to the step that opens next."""
        try:
            if not self.account.retract(kind):
                return
            self._pop_aside_annotations()
            if self.account.depth == 0:
                self._aside_mark = None
        except Exception as error:
            self.faults.report("aside", error)

    def _pop_aside_annotations(self) -> None:
        """Close the innermost aside's profiler label and NVTX range."""
        label = self._aside_labels.pop() if self._aside_labels else None
        if label is not None:
            label.__exit__(None, None, None)
        if self._nvtx_on:
            self.nvtx.pop()

    @contextlib.contextmanager
    def aside(self, kind: str) -> Iterator[None]:
        """``with engine.aside("checkpoint"): ...``: the user's errors pass through untouched."""
        self.begin_aside(kind)
        try:
            yield
        finally:
            self.end_aside(kind)

    @property
    def closed(self) -> bool:
        return self._closed

    def note_error(self, error: BaseException) -> None:
        """An error passed through a wrapper of perfhooks' (the caller may yet catch it): see ``lifecycle``."""
        lifecycle.note_error(self, error)

    def exception(self, error: BaseException, deadline_s: float | None = None, quiet: bool = False) -> None:
        """The user's error is on its way out: the run closes as ``failed`` (``lifecycle.fail``). Never raises."""
        lifecycle.fail(self, error, deadline_s, quiet)

    def abandon(self, deadline_s: float | None = None, quiet: bool = False) -> None:
        """The run ended without its end event: close it (``lifecycle.abandon``)."""
        lifecycle.abandon(self, deadline_s, quiet)

    # ----------------------------------------------------------------- torch.compile
    def _compile_started(self, _args: Any) -> None:
        """Dynamo starts compiling (a frame, or a backward compiled lazily): the open phase pauses, and the time
        goes to the run account's ``compiling``. Only on the training thread (the engine is not thread-safe)."""
        try:
            if self._closed or threading.get_ident() != self._thread:
                return
            self._compile_resume = self.open_phase
            self.begin_aside(COMPILING)
        except Exception as error:
            self.faults.report("compile", error)

    def _compile_ended(self, _args: Any) -> None:
        try:
            if self._closed or threading.get_ident() != self._thread or self.account.innermost != COMPILING:
                return
            self.end_aside(COMPILING)
            if self._record is not None:
                self._record.compiled = True
                if not self.compile_steps or self.compile_steps[-1] != self.step:
                    self.compile_steps.append(self.step)
            resume, self._compile_resume = self._compile_resume, None
            if resume is not None and self._record is not None and self.account.depth == 0:
                self.phase_start(resume)
        except Exception as error:
            self.faults.report("compile", error)

    def compile_section(self) -> dict[str, Any] | None:
        """The report's ``compile`` section: dynamo's counts for this run and the steps that compiled."""
        summary = self.compile_watch.summary()
        if summary is None:
            return None
        summary["compiled_steps"] = list(self.compile_steps[:50])
        return summary

    # ----------------------------------------------------------------- model hooks
    @guarded("watch_model")
    def watch_model(self, model: torch.nn.Module) -> None:
        """The model whose parameters the memory census attributes; per-module NVTX ranges when asked."""
        if self.memory is not None:
            self.memory.models.append(model)
        if any(hasattr(module, "_orig_mod") or getattr(module, "_compiled_call_impl", None) is not None
               for module in model.modules()):
            self.model_compiled = True
        if self.config.module_ranges:
            add_module_ranges(model, self.nvtx, self.hooks)
            if self.model_compiled:
                self.once.warn("module_ranges_compiled", "module_ranges: no NVTX range exists inside a torch.compile "
                               "region; the ranges of compiled modules' submodules are not recorded")

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state.get("step", self.step))

    def compiled_in_run(self) -> bool:
        """True when torch.compile compiled a graph in this process since this engine started."""
        return compiled_graphs() > self._compiles_at_start

    # ----------------------------------------------------------------- output
    def report(self, live: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The report now (on the training thread: it reads the statistics)."""
        diagnoses = self.diagnoses(live)
        windows = self.windows.snapshot()
        return build_report(framework=self.framework, status=self.status, rank=self.rank,
                            world_size=self.world_size, device=self.device, stats=self.stats,
                            windows=windows, diagnoses=diagnoses,
                            throughput=self.guarded_call("throughput", lambda: self.throughput(diagnoses, windows)),
                            faults=self.faults.as_list(), error=self.error,
                            memory=self.guarded_call("memory_report", self.memory.section) if self.memory else None,
                            run=self.account.section(self.stats.training_ms), global_step=self.global_step,
                            run_id=self.run_id, started_at=self.started_at,
                            compile=self.guarded_call("compile_report", self.compile_section),
                            unfinished_steps=self.pending.unfinished,
                            named_work=self.named_work_per_step() or None)

    def close(self, deadline_s: float | None = None) -> dict[str, Any] | None:
        """End of training (once): the report, the table, every resource released (``lifecycle.close``).

        ``deadline_s`` bounds the waits (writer, W&B, other ranks) in total.
        """
        return lifecycle.close(self, deadline_s)

    @property
    def open_phase(self) -> str | None:
        """The phase open now, if any."""
        return self._phase[0] if self._phase else None

    def training_ended(self) -> None:
        """The framework's training loop ended (its end hook); the close comes later (after its other end hooks):
        the last step ends here and the run's wall clock stops."""
        try:
            if not self._closed:
                self.end_open_step()
                self.account.close()
        except Exception as error:
            self.faults.report("training_ended", error)

    def end_open_step(self) -> None:
        """At close: end an aside cut short, count a last step that stepped, drop one cut short."""
        if self._flops_watch:
            self._stop_counting(keep=self.status != "failed")
        while self.account.depth:
            self.end_aside(self.account.innermost)  # type: ignore[arg-type]
        if self._phase is not None:
            self._close_phase()
        if self._record is not None and self._record.stepped and not self.cuda_broken:
            self.step_end()  # the last step: its optimizer stepped (an error after that too), no fetch will end it
        if self._record is not None:  # a step cut short (end of data or an error) is not counted
            self._drop_record()

    def _drop_record(self) -> None:
        """The open record is no step: close its ``ProfilerStep`` label and return its marks."""
        record, self._record = self._record, None
        self.windows.end_step_label()
        self.pending.discard(record)  # type: ignore[arg-type]

    # ----------------------------------------------------------------- internals
    def _close_phase(self) -> Any:
        """Close the open phase; its end mark (which the next phase may start from)."""
        name, start = self._phase  # type: ignore[misc]
        self._phase = None
        if self.labels.is_open:
            self.labels.exit()
        if self._nvtx_on:
            self.nvtx.pop()
        end = self.clock.mark()
        self._record.intervals.append((name, start, end))  # type: ignore[union-attr]
        if self.memory is not None and not self.cuda_broken:
            try:
                self.memory.observe(self.step, name)
                if len(self.memory.captures) != self._captures_seen:  # a capture paused this step
                    self._captures_seen = len(self.memory.captures)
                    self._record.own = True  # type: ignore[union-attr]
            except Exception as error:
                self.faults.report("memory_sample", error)
        return end

    def _drive_windows(self, step: int) -> None:
        trigger = "schedule"
        try:
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
            if self._on_demand is not None and self._on_demand(step) is not Action.NONE:
                trigger = "on_demand"
        except Exception as error:
            self.faults.report("trigger", error)
        try:
            self.windows.at_step(step, trigger)
        except Exception as error:
            self.faults.report("window", error)

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

    def live_diagnoses(self) -> list[dict[str, Any]]:
        """Diagnoses from phase timings alone (training thread)."""

        try:
            run = self.account.section(self.stats.training_ms)
            live = diagnose_live(self.stats, self.config.thresholds, compiled=self.compiled_in_run(), run=run,
                                 named_work=self.named_work_per_step())
            live += diagnose_compile(self.compile_section(), run, self.config.thresholds)
            if self.memory is not None:
                live += self.memory.diagnoses(self.config.thresholds)
            return live
        except Exception as error:
            self.faults.report("live_diagnoses", error)
            return []

    def diagnoses(self, live: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Live diagnoses merged with the latest analysed window's, ranked by estimated gain."""

        live = self.live_diagnoses() if live is None else live
        return rank(reconcile(live, self.trace_diagnoses, self.stats.steady_step.count, self.trace_window_steps))

    def _on_window_written(self, path: Path, window: dict[str, Any]) -> None:
        """On the writer thread, after a window's trace is written: its metrics and diagnoses."""
        try:
            metrics, diagnoses = analyze_window(path, self.config.thresholds, window["first_step"])
        except Exception as error:
            self.faults.report("window_analysis", error)
            return
        self.windows.update(window, metrics=metrics)
        self.trace_window_steps = window["last_step"] - window["first_step"] + 1
        self.trace_diagnoses = diagnoses

    def _save_report_async(self) -> None:
        """At a window's end: snapshot the statistics here, write on the writer thread once the window's
        trace has been written and analysed (the writer runs jobs in order), with its diagnoses merged."""
        live = self.live_diagnoses()
        report = self.report(live)
        global_step = self.global_step

        def write() -> None:
            report["windows"] = self.windows.snapshot()
            report["diagnoses"] = self.diagnoses(live)
            write_report(self.output_dir, report)
            written = [w for w in report["windows"] if not w.get("pruned")]
            if self.wandb is not None and written:
                self.wandb.log_window(global_step, written[-1], report["diagnoses"])

        self.writer.submit("report_write", write)

    def guarded_call(self, kind: str, fn: Any) -> Any:
        """``fn()``, or None after reporting its fault once."""
        try:
            return fn()
        except Exception as error:
            self.faults.report(kind, error)
            return None


def compiled_graphs() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process; 0 when dynamo was never imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    try:
        return int(utils.counters["stats"]["unique_graphs"])
    except Exception:
        return 0



class NullEngine:
    """The engine of a run that is not profiled (perfhooks off, or an engine that failed to start), as Lightning's
    ``PassThroughProfiler``: every event is a no-op, so adapters call the engine unconditionally and "off" costs
    one attribute lookup and a call."""

    #: False: nothing is profiled (an :class:`Engine` is ``active``).
    active = False
    #: A null run never opens, so there is nothing to close.
    closed = True
    open_phase: str | None = None
    memory = None

    def __init__(self) -> None:
        self.faults = FaultLog()
        self.once = Once()

    def fetch(self) -> None:
        pass

    def training_ended(self) -> None:
        pass

    def expect_framework_flops(self) -> None:
        pass

    def named(self, name: str, ms: float) -> None:
        pass

    def batch(self, batch: Any) -> None:
        pass

    def note_flops(self, per_step: float, source: str) -> None:
        pass

    def note_precision(self, dtype: str, source: str) -> None:
        pass

    def fetched(self, batches: int) -> None:
        pass

    def stepped(self, global_step: int | None = None) -> None:
        pass

    def step_start(self) -> None:
        pass

    def phase_start(self, name: str) -> None:
        pass

    def phase_end(self, name: str) -> None:
        pass

    def step_end(self) -> None:
        pass

    def idle(self) -> None:
        pass

    def begin_aside(self, kind: str) -> None:
        pass

    def end_aside(self, kind: str) -> None:
        pass

    def retract_aside(self, kind: str) -> None:
        pass

    @contextlib.contextmanager
    def aside(self, kind: str) -> Iterator[None]:
        yield

    def note_error(self, error: BaseException) -> None:
        pass

    def exception(self, error: BaseException, deadline_s: float | None = None, quiet: bool = False) -> None:
        pass

    def abandon(self, deadline_s: float | None = None, quiet: bool = False) -> None:
        pass

    def close(self, deadline_s: float | None = None) -> dict[str, Any] | None:
        return None

    def watch_model(self, model: torch.nn.Module) -> None:
        pass

    def defer_windows_to(self, owner: str) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


#: What an integration holds: a live engine, or the null one.
RunEngine = Engine | NullEngine


def _existing_ancestor(path: Path) -> Path | None:
    """``path`` or its nearest existing parent (None when even the root is not there)."""
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            return candidate
    return None
