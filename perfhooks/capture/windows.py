"""Capture windows: ``torch.profiler`` sessions opened and closed by the engine's schedule.

One ``torch.profiler.profile`` lives for one window (or back-to-back cycles). It is driven by
the engine's own pure schedule function, so ``ProfilerStep#N`` in the trace is the global
optimizer step N. Traces are exported at the window's end, then gzipped, renamed into place
and pruned to ``max_traces`` files and ``max_trace_bytes`` on the background writer.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfhooks.capture.heap import WindowMemory, peak_rss_bytes, release_freed_heap, rss_bytes
from perfhooks.capture.labels import profiler_recording
from perfhooks.capture.schedule import Action
from perfhooks.device import cuda_extras
from perfhooks.device.cupti_teardown import CuptiTeardown
from perfhooks.faults import FaultLog, Once
from perfhooks.files.atomic import atomic_gzip_file
from perfhooks.files.writer import BackgroundWriter
from perfhooks.locks import bounded, holds_lock

ActionFn = Callable[[int], Action]


@dataclass(frozen=True)
class WindowSettings:
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    cuda: bool = False
    nsys_capture: bool = False
    detach_cupti: bool = True
    max_traces: int = 5
    max_trace_bytes: int = 512 * 2**20
    #: A window stops early once the process's RSS grew by more than the larger of this and a quarter of its RSS
    #: before the window (bytes; None: no bound).
    rss_limit_bytes: int | None = 150 * 2**20
    #: A window stops early after the recorded step that brings its recorded micro-batches to this many (None: no
    #: bound).
    max_micro_batches: int | None = 8


def trace_name(rank: int, first_step: int) -> str:
    return f"rank{rank}.step{first_step}.pt.trace.json.gz"


_TRACE_RE = re.compile(r"^rank(\d+)\.step(\d+)\.pt\.trace\.json\.gz$")
#: What an export killed part way leaves: torch's raw JSON (``.NAME.PID.json``, possibly gigabytes) and the
#: gzip's temp file (``.NAME.XXXX.tmp``).
_RAW_RE = re.compile(r"^\.rank(\d+)\.step\d+\.pt\.trace\.json\.gz\.(\d+)\.json$")
_TEMP_RE = re.compile(r"^\.rank(\d+)\.step\d+\.pt\.trace\.json\.gz\..*\.tmp$")
#: A gzip temp file older than this (seconds) is a dead export's, not one being written.
STALE_TEMP_S = 600.0
#: Window records kept (the most recent): a long run with ``repeat=0`` keeps its report bounded.
MAX_WINDOW_RECORDS = 100


class CaptureWindows:
    """Opens, steps and closes ``torch.profiler`` sessions as the action function says."""

    def __init__(self, traces_dir: Path, rank: int, world_size: int, action_fn: ActionFn,
                 settings: WindowSettings, writer: BackgroundWriter, faults: FaultLog, once: Once,
                 on_saved: Callable[[], None] = lambda: None,
                 on_written: Callable[[Path, dict[str, Any]], None] | None = None) -> None:
        self.traces_dir = traces_dir
        self.rank = rank
        self.world_size = world_size
        self.action_fn = action_fn
        self.settings = settings
        self.writer = writer
        self.faults = faults
        self.once = once
        self.on_saved = on_saved
        self.on_written = on_written
        self.windows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._profiler: Any = None
        self._first_step: int | None = None
        self._last_step: int | None = None
        self._trigger = "schedule"
        self._nsys_running = False
        self._external: str | None = None
        #: While a signal's handler stops the window: where the export job goes (not to the writer).
        self._for_signal: list[Callable[[], None]] | None = None
        #: ``TEARDOWN_CUPTI=1`` from the first CUDA window to the close: CUPTI let go after each window.
        self.cupti_teardown = CuptiTeardown()
        #: The open window's RSS, against its bound; why the last window stopped early, if it did; and whether
        #: the schedule's current cycle is given up (no window reopens until the schedule says NONE).
        self.memory = WindowMemory(settings.rss_limit_bytes)
        self._stopped_early: str | None = None
        self._holding_off = False
        #: Micro-batches the open window recorded so far (against ``settings.max_micro_batches``).
        self._recorded_micro_batches = 0
        #: Training forwards started in the step being recorded (its micro-batches so far), and the step a window
        #: stopped inside: ``{step, recorded_micro_batches, micro_batches}`` for its record.
        self._step_forwards = 0
        self._partial: dict[str, int] | None = None

    def defer_to(self, owner: str) -> None:
        """Another ``torch.profiler`` user (e.g. Lightning's PyTorchProfiler) is configured: open no window.

        Two Kineto sessions at once crash the process, and a session in warmup cannot be seen
        from Python, so integrations that know of one say so up front.
        """
        self._external = owner
        self.once.warn("other_profiler", f"another torch.profiler session ({owner}) is configured; perfhooks "
                       "opens no second one (phase timing and NVTX continue)")

    @property
    def is_open(self) -> bool:
        return self._profiler is not None

    @holds_lock
    def at_step(self, step: int, trigger: str = "schedule", micro_batches: int = 0) -> Action:
        """Called once per step, at its start, before any of its work; the step's action. ``micro_batches``: those of
        the step that just ended (a recorded one's count towards the window's bound)."""
        action = self.action_fn(step)
        if self._holding_off:  # a window stopped early (memory, its micro-batches): its cycle is given up
            if action is not Action.NONE:
                return Action.NONE
            self._holding_off = False
        if self._profiler is None:
            if action is Action.NONE or self._external is not None:
                return action
            if profiler_recording():
                self.once.warn("other_profiler", "another torch.profiler session is already running; "
                               "perfhooks opens no second one (phase timing and NVTX continue)")
                return action
            self._open(step, action, trigger)
        else:
            if self._last_step == step - 1:  # the step that ended was recorded
                self._recorded_micro_batches += max(1, micro_batches)
            bound = self.settings.max_micro_batches
            if action.recording and bound is not None and self._recorded_micro_batches >= bound:
                # before the next step's label opens: the trace ends with the last step it recorded
                return self._stop_early(f"stopped at step {step}: it recorded {self._recorded_micro_batches} "
                                        f"micro-batches (steps {self._first_step} to {self._last_step}), the "
                                        f"window's bound of {bound}")
            self._profiler.step()  # may save the previous cycle through _on_trace_ready
            if action is Action.NONE:
                self._profiler.stop()
                self._profiler = None
            release_freed_heap()  # the recorded step's freed tensors, kept in the heap by the profiler's events
            added = self.memory.over_bound() if self._profiler is not None else None
            if added is not None:  # the profiler's buffers grew past the bound: the window ends here, saved
                return self._stop_early(f"stopped at step {step}: the process's RSS grew by {added / 2**20:.0f} "
                                        f"MiB, past the window's {self.memory.bound / 2**20:.0f} MiB bound")
        if action.recording:
            if self._first_step is None:
                self._first_step = step
                self._nsys(start=True)
            self._last_step = step
        self._step_forwards = 0
        return action

    @property
    def recording(self) -> bool:
        """A window records the step open now (its forwards are checked against the memory bound)."""
        return self._profiler is not None and self._last_step is not None

    def forward_starting(self, step: int, micro_batches: int) -> bool:
        """A training forward of ``step`` starts while a window records it: from its second micro-batch on, the RSS
        is checked against the window's bound (the heap's freed pages given back first), and a window past it
        stops here, inside the step: its trace holds the step's first micro-batches, and its record says how many
        of the step's ``micro_batches`` (the step's count so far, or the last step's where larger). True when it
        stopped."""
        self._step_forwards += 1
        if self._step_forwards < 2 or self._profiler is None or self._last_step != step:
            return False
        release_freed_heap()
        added = self.memory.over_bound()
        if added is None:
            return False
        recorded = self._step_forwards - 1
        self._partial = {"step": step, "recorded_micro_batches": recorded,
                         "micro_batches": max(micro_batches, recorded + 1)}
        self.end_step_label()  # the step's label closes where the recording does
        self._stop_early(f"stopped inside step {step}, at its micro-batch {recorded + 1}: the process's RSS grew by "
                         f"{added / 2**20:.0f} MiB, past the window's {self.memory.bound / 2**20:.0f} MiB bound; the "
                         f"trace holds {recorded} of the step's micro-batches")
        return True

    def _stop_early(self, why: str) -> Action:
        """End the open window here, saved, and give up the rest of its cycle; ``why`` goes in its record."""
        self._stopped_early = why
        self._holding_off = True
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        return Action.NONE

    @holds_lock
    def end_step_label(self) -> None:
        """Close ``ProfilerStep#N`` now: what follows (an evaluation, a checkpoint, an epoch end) is not step N's.

        torch opens the label at ``profiler.step()`` and closes it at the next one; it drops its
        reference when it closes it, and so does this.
        """
        profiler = self._profiler
        label = getattr(profiler, "step_rec_fn", None) if profiler is not None else None
        if label is not None:
            profiler.step_rec_fn = None
            label.__exit__(None, None, None)

    @property
    def _device_activity(self) -> bool:
        """Windows record CUDA activity (CUPTI): on CUDA, unless Nsight Systems holds CUPTI."""
        return self.settings.cuda and not self.settings.nsys_capture

    @holds_lock
    def close(self) -> None:
        """Stop an open window; a partially recorded one is saved. ``profiler.stop()`` synchronizes the device:
        the lifecycle calls this only once the device has drained its queue within the deadline."""
        profiler, self._profiler = self._profiler, None
        try:
            if profiler is not None:
                profiler.stop()
            self._nsys(start=False)
        finally:
            self.cupti_teardown.release()

    def stop_for_signal(self) -> Callable[[], None] | None:
        """Stop the open window from a signal's handler, taking no lock (the interrupted thread is not inside this
        object's code: :mod:`perfhooks.locks`); the job that exports its partial trace, to run on another thread,
        or None. The window's record is added without the lock (one list append) and no analysis follows."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return None
        jobs: list[Callable[[], None]] = []
        self._for_signal = jobs
        try:
            profiler.stop()  # torch calls _on_trace_ready, which leaves its job here
        finally:
            self._for_signal = None
        self._nsys(start=False)
        return jobs[0] if jobs else None

    @holds_lock
    def abandon(self) -> None:
        """The device did not drain by the deadline, or raised a CUDA error: let go of the open window. A window
        that records the CPU only is stopped (``stop()`` then touches no device) and its partial trace saved. One
        with CUDA activity is not: its ``stop()`` synchronizes the device, which could block for ever or raise;
        torch's profiler then records until the process ends, which perfhooks says once. The Nsight range is
        left as it is (closing it is a device call)."""
        profiler, self._profiler = self._profiler, None
        self.cupti_teardown.release()
        if profiler is None:
            return
        if not self._device_activity:
            self._nsys_running = False  # the Nsight range stays as it is: closing it is a device call
            profiler.stop()
            return
        self.once.warn("window_left_open", "a capture window with CUDA activity was open when the device failed or "
                       "hung; torch's profiler keeps recording until this process ends (stopping it would wait on "
                       "the device). A notebook or a retry in this process: restart the process")

    def _open(self, step: int, action: Action, trigger: str) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        # CUPTI takes one subscriber: under nsys_capture Nsight Systems records the GPU, and the window the CPU.
        if self._device_activity:
            activities.append(ProfilerActivity.CUDA)
            if self.settings.detach_cupti:
                self.cupti_teardown.arm()  # read by Kineto when this window stops
        profiler = profile(activities=activities, schedule=self._torch_action,
                           on_trace_ready=self._on_trace_ready, record_shapes=self.settings.record_shapes,
                           profile_memory=self.settings.profile_memory, with_stack=self.settings.with_stack)
        # Number the profiler's steps as the run's steps, so ProfilerStep#N is optimizer step N.
        profiler.step_num = step
        profiler.current_action = self._torch_action(step)
        if hasattr(profiler, "_prev_schedule_action"):  # torch >= 2.8 tracks the raw schedule output
            profiler._prev_schedule_action = profiler.current_action
        self._add_rank_metadata(profiler)
        self._trigger = trigger
        self._recorded_micro_batches = 0
        self.memory.opened()
        profiler.start()
        self._profiler = profiler

    def _torch_action(self, step: int) -> Any:
        from torch.profiler import ProfilerAction

        return {
            Action.NONE: ProfilerAction.NONE,
            Action.WARMUP: ProfilerAction.WARMUP,
            Action.ACTIVE: ProfilerAction.RECORD,
            Action.ACTIVE_AND_SAVE: ProfilerAction.RECORD_AND_SAVE,
        }[self.action_fn(step)]

    def _add_rank_metadata(self, profiler: Any) -> None:
        """torch adds ``distributedInfo`` only under torch.distributed; add it always, for HTA and friends."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return
        if hasattr(profiler, "preset_metadata_json"):
            info = {"backend": "none", "rank": self.rank, "world_size": self.world_size}
            profiler.preset_metadata_json("distributedInfo", json.dumps(info))

    def _nsys(self, start: bool) -> None:
        if not (self.settings.nsys_capture and self.settings.cuda) or start == self._nsys_running:
            return
        cuda_extras.profiler_range(start)
        self._nsys_running = start

    @holds_lock
    def _on_trace_ready(self, profiler: Any) -> None:
        first = self._first_step if self._first_step is not None else profiler.step_num
        last = self._last_step if self._last_step is not None else first
        self._first_step = self._last_step = None
        self._nsys(start=False)
        self.traces_dir.mkdir(parents=True, exist_ok=True)
        final = self.traces_dir / trace_name(self.rank, first)
        temp = self.traces_dir / f".{final.name}.{os.getpid()}.json"
        # This cycle's results: torch gives the next cycle a new object, so the export can run later,
        # on the writer thread. The training thread goes straight on to its next step (and collective).
        results = profiler.profiler
        record = {"path": str(final), "first_step": first, "last_step": last, "trigger": self._trigger,
                  "pruned": False, **(self.memory.closed() if self._for_signal is None else {})}
        if self._stopped_early is not None:
            record["stopped_early"], self._stopped_early = self._stopped_early, None
        if self._partial is not None:
            record["partial_step"], self._partial = self._partial, None
        if self._for_signal is not None:  # a signal's handler: no lock, no writer, no analysis
            self.windows.append(record)
            self._for_signal.append(lambda: self._finish(results, temp, final, record, analyse=False))
            return
        with self._lock:
            self.windows.append(record)
            del self.windows[:-MAX_WINDOW_RECORDS]
        self.writer.submit("trace_export", lambda: self._finish(results, temp, final, record))
        self.on_saved()

    def _finish(self, results: Any, temp: Path, final: Path, record: dict[str, Any], analyse: bool = True) -> None:
        """On the writer thread: export, compress and place the trace, prune old ones, then hand it to analysis."""
        before, high = rss_bytes(), peak_rss_bytes()
        try:
            results.export_chrome_trace(str(temp))
            after = peak_rss_bytes()
            if before is not None and high is not None and after is not None and after > high:
                self.update(record, export_peak_rss_added_bytes=after - before)  # the export set a new peak
            atomic_gzip_file(temp, final)
        except BaseException as error:
            temp.unlink(missing_ok=True)
            self.update(record, pruned=True, error=f"export failed: {type(error).__name__}")
            raise
        self._prune()
        del results  # the cycle's events
        try:
            if analyse and self.on_written is not None and final.exists():
                self.on_written(final, record)  # the window's analysis
        finally:
            release_freed_heap()  # what the export and the analysis freed, given back

    def _sweep_leftovers(self) -> None:
        """Delete what a killed export of this rank left: a raw JSON whose process is gone, a temp file older than
        ``STALE_TEMP_S``. A live process's files (another run of this rank still exporting) stay."""
        now = time.time()
        for path in self.traces_dir.iterdir():
            raw, temp = _RAW_RE.match(path.name), _TEMP_RE.match(path.name)
            try:
                dead_raw = raw is not None and int(raw.group(1)) == self.rank and not _alive(int(raw.group(2)))
                old_temp = (temp is not None and int(temp.group(1)) == self.rank
                            and now - path.stat().st_mtime > STALE_TEMP_S)
                if dead_raw or old_temp:
                    path.unlink()
            except OSError:
                continue

    @holds_lock
    def _prune(self) -> None:
        """Keep at most ``max_traces`` of this rank's traces, oldest deleted first, under the byte cap; sweep
        what killed exports left."""
        self._sweep_leftovers()
        ours = []
        for path in self.traces_dir.iterdir():
            match = _TRACE_RE.match(path.name)
            if match and int(match.group(1)) == self.rank:
                ours.append((int(match.group(2)), path, path.stat().st_size))
        ours.sort()
        total = sum(size for _, _, size in ours)
        while ours and (len(ours) > self.settings.max_traces or total > self.settings.max_trace_bytes):
            _, path, size = ours.pop(0)
            if not ours and size > self.settings.max_trace_bytes:
                self.once.warn("trace_over_cap", f"trace {path.name} ({size} bytes) is over max_trace_bytes "
                               f"({self.settings.max_trace_bytes}) and was deleted; shorten the window")
            path.unlink(missing_ok=True)
            total -= size
            with self._lock:
                for window in self.windows:
                    if window["path"] == str(path):
                        window["pruned"] = True

    @holds_lock
    def update(self, record: dict[str, Any], **fields: Any) -> None:
        """Add fields to a window's record (from the writer thread), under the lock that snapshots take."""
        with self._lock:
            record.update(fields)

    def snapshot(self) -> list[dict[str, Any]]:
        with bounded(self._lock):  # a signal's saving reads it: the lock's holder may be the interrupted thread
            return [dict(window) for window in self.windows]


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (``kill(pid, 0)``; one we may not signal is alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
