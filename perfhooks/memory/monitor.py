"""Memory telemetry, captures near the limit, and what was alive at an OOM.

Sampling costs no host sync: CUDA figures come from the caching allocator's counters, CPU figures
from ``/proc/self/statm``. Both are read at phase boundaries at most every ``memory_poll_s``
seconds, so the step and phase of the peak are known to that resolution.

**The signal.** Near the limit means ``used_bytes`` at ``threshold`` of the limit, or the caching allocator
retrying (``num_alloc_retries`` rising: it had to free its cache and call cudaMalloc again). On CUDA the limit
is the per-process cap when ``set_per_process_memory_fraction`` set one, else the device's total (or
``memory_capacity_bytes``), and ``used_bytes`` is what counts against it: reserved memory (fragmentation
included) plus what lies outside PyTorch (the CUDA context, NCCL buffers, other processes: the driver's
``total - free - reserved``) against the device; reserved memory against the cap; and the allocator's own peak
when it rose since the last sample, so a peak inside a phase counts. On the CPU it is resident (or virtual) size.

**Allocation history** (CUDA) is what gives a snapshot its stacks. ``history=None`` (the default)
arms it on approach: it starts when allocated memory crosses ``arm_fraction`` of capacity or the
allocator starts retrying, so a capture near the limit or at an OOM has the stacks of the
allocations that led there and a healthy run pays nothing. ``True`` records from the start,
``False`` never. A history the user started is never changed (perfhooks snapshots from it), and
perfhooks stops only the history it started.

**Captures** take only what must be taken at that moment on the training thread (the census's
object walk, the snapshot object); the census JSON, the snapshot pickle and its HTML plot are
written by the background writer.
"""

from __future__ import annotations

import os
import pickle
import resource
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.device import cuda_extras
from perfhooks.device.room import DeviceRoom
from perfhooks.faults import FaultLog, Once
from perfhooks.files.atomic import TooLarge, atomic_write_bytes, atomic_write_json, atomic_write_stream
from perfhooks.memory.live_tensors import live_tensor_census
from perfhooks.memory.oom import find_oom, requested_bytes
from perfhooks.rules.memory import MemoryFigures, oom_recommendations
from perfhooks.timebase import monotonic_ns

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Usage must fall this far (fraction of capacity) below the threshold before the next capture.
HYSTERESIS = 0.05
#: Largest snapshot pickle written (bytes); bigger ones are skipped with a warning.
MAX_SNAPSHOT_BYTES = 512 * 2**20
#: Nanoseconds between two reads of the driver's free memory (``cudaMemGetInfo``) while far from the limit.
DRIVER_EVERY_NS = 1_000_000_000
#: Memory samples kept for the report's memory line (the most recent).
SERIES_SAMPLES = 500


def cpu_limit() -> tuple[int, str]:
    """The smallest of cgroup ``memory.max``, ``RLIMIT_AS`` and physical memory (bytes), and which it is."""
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            limits.append((int(text), "cgroup"))
        break
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
        limits.append((soft, "rlimit_as"))
    if hasattr(os, "sysconf"):
        limits.append((_PAGE * os.sysconf("SC_PHYS_PAGES"), "physical"))
    return min(limits) if limits else (0, "unknown")


def cpu_usage() -> dict[str, int]:
    """Process virtual size and resident set (bytes)."""
    try:
        size, resident = Path("/proc/self/statm").read_text().split()[:2]
        return {"vms_bytes": int(size) * _PAGE, "rss_bytes": int(resident) * _PAGE}
    except (OSError, ValueError):
        return {"vms_bytes": 0, "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


class MemoryMonitor:
    """Samples memory at phase boundaries, captures once per crossing of the threshold, dumps at OOM."""

    def __init__(self, output_dir: Path, room: DeviceRoom, faults: FaultLog, once: Once, *, threshold: float,
                 capacity_bytes: int | None, poll_s: float, history: bool | None, history_entries: int,
                 max_captures: int, arm_fraction: float = 0.75,
                 submit: Callable[[str, Callable[[], None]], None] | None = None) -> None:
        self.room = room
        self.arm_fraction = arm_fraction
        self.history_entries = history_entries
        #: ``from_start``, ``on_approach`` or ``off``: the ``memory_history`` setting.
        self.history_mode = {True: "from_start", None: "on_approach", False: "off"}[history]
        #: Who records the allocation history now: ``perfhooks``, ``user`` or None.
        self.history_owner: str | None = None
        #: When and why the approach armed the history: {"step", "signal"}, or None.
        self.armed: dict[str, Any] | None = None
        self._submit = submit
        self._start_retries: int | None = None
        self._retries_captured = False
        self._last_peak = 0
        self.output_dir = output_dir
        self.cuda = room.is_cuda
        self.faults = faults
        self.once = once
        self.threshold = threshold
        self.poll_ns = int(poll_s * 1e9)
        self.max_captures = max_captures
        self.models: list[Any] = []
        self.captures: list[dict[str, Any]] = []
        self.latest: dict[str, Any] = {}
        self.peak = {"used_bytes": 0, "step": None, "phase": None}
        #: (step, used bytes) of recent samples, for the memory line of the report.
        self.series: deque[tuple[int, int]] = deque(maxlen=SERIES_SAMPLES)
        #: (step, bytes in use, shapes seen) at the start of steps (rate-limited): the same point of each step, for
        #: the ``memory_growth`` rule. Allocated bytes on CUDA, resident memory on the CPU.
        self.step_samples: deque[tuple[int, int, int]] = deque(maxlen=SERIES_SAMPLES)
        #: The distinct batch shapes the run's steps brought so far (set by the engine; -1: not counted), taken with
        #: each step-start sample: growth that comes only with new shapes is their caches', not a leak.
        self.shapes_seen: Callable[[], int] = lambda: -1
        #: ``monotonic_ns()`` before which a step's start takes no sample (compared in place at each step's open).
        self.next_step_ns = 0
        self.census: dict[str, Any] | None = None
        self._capture_ready = True  # a near-limit capture may fire (re-armed 5 points below the threshold)
        #: ``monotonic_ns()`` of the next phase-boundary sample (earlier boundaries are not sampled).
        self.next_sample_ns = 0
        self._observer_attached = False
        #: The OOM observer's calls in this run (what the allocator said at each OOM), the latest last.
        self.observed: list[dict[str, Any]] = []
        self.observed_count = 0
        #: The observer's calls for the process's other devices (the latest few): perfhooks watches one device.
        self.observed_elsewhere: list[dict[str, Any]] = []
        self._oom_snapshot_taken = False
        self.history = False
        #: The driver's last (free, total, outside PyTorch) bytes and when to read them again.
        self._driver: tuple[int, int, int] | None = None
        self._driver_next_ns = 0
        self._near = False  # usage past arm_fraction of the limit: the driver is read at every sample
        if self.cuda:
            _free, total = room.memory_info()
            allowed = room.allowed_bytes(total)
            self.device_total = total
            self._last_peak = room.memory().peak_allocated_bytes  # a peak from before this run is not this run's
            if capacity_bytes:
                self.capacity, self.limit_source = capacity_bytes, "configured"
            elif allowed is not None:
                self.capacity, self.limit_source = allowed, "fraction_cap"
            else:
                self.capacity, self.limit_source = total, "device"
            if self.history_mode == "from_start":
                self._record_history()
        else:
            self.device_total = 0
            self.capacity, self.limit_source = (capacity_bytes, "configured") if capacity_bytes else cpu_limit()

    # ------------------------------------------------------------------ sampling
    def observe(self, step: int, phase: str | None) -> None:
        """At a phase boundary: sample (rate-limited), track the peak, capture on crossing the threshold. Not
        while the device is lost or a CUDA graph captures (``cudaMemGetInfo`` would invalidate the graph)."""
        now = monotonic_ns()
        if now < self.next_sample_ns or (self.cuda and not self.room.free()):
            return
        self.next_sample_ns = now + self.poll_ns
        figures = self.sample()
        used = figures["used_bytes"]
        self.series.append((step, used))
        if used > self.peak["used_bytes"]:
            self.peak = {"used_bytes": used, "step": step, "phase": phase}
        retries = figures.get("num_alloc_retries")
        if self._start_retries is None and retries is not None:
            self._start_retries = retries
        retrying = retries is not None and retries > (self._start_retries or 0)
        fraction = used / self.capacity if self.capacity else 0.0
        if self.armed is None and self.history_mode == "on_approach" and (fraction >= self.arm_fraction or retrying):
            self.arm(step, "alloc_retries" if retrying and fraction < self.arm_fraction else "allocated")
        if retrying and not self._retries_captured:  # the allocator freed its cache to satisfy an allocation
            self._retries_captured = True
            self.capture(step, phase, "near_limit", signal="alloc_retries")
        elif self._capture_ready and self.capacity and fraction >= self.threshold:
            self._capture_ready = False
            self.capture(step, phase, "near_limit", signal="allocated")
        elif not self._capture_ready and fraction < self.threshold - HYSTERESIS:
            self._capture_ready = True

    def observe_step_start(self, step: int) -> None:
        """At a step's start (rate-limited like phase samples): the bytes in use there, for ``memory_growth``."""
        now = monotonic_ns()
        if now < self.next_step_ns or (self.cuda and not self.room.free()):
            return
        self.next_step_ns = now + self.poll_ns
        used = self.room.memory().allocated_bytes if self.cuda else cpu_usage()["rss_bytes"]
        self.step_samples.append((step, used, self.shapes_seen()))

    def arm(self, step: int, signal: str) -> None:
        """Memory is approaching the limit: start the allocation history (CUDA) so a later capture has stacks."""
        self.armed = {"step": step, "signal": signal}
        if self.cuda:
            self._record_history()

    def sample(self) -> dict[str, Any]:
        """The figures now. On CUDA ``used_bytes`` is what counts against the limit: reserved memory plus what
        is outside PyTorch (the CUDA context, NCCL buffers, other processes) against the device, reserved memory
        against a per-process cap, allocated memory against a configured capacity; and a peak the allocator saw
        since the last sample counts too, so a peak inside a phase is not missed."""
        if self.cuda:
            figures = self._cuda_sample()
            self._attach_observer()
        else:
            figures = cpu_usage()
            figures["used_bytes"] = figures["vms_bytes" if self.limit_source == "rlimit_as" else "rss_bytes"]
        self.latest = figures
        return figures

    def _cuda_sample(self) -> dict[str, Any]:
        """The allocator's counters at every sample; the driver's free bytes (``cudaMemGetInfo``, 5-12 µs) at
        most every :data:`DRIVER_EVERY_NS`, and at every sample once usage is past ``arm_fraction`` of the limit:
        between two reads, memory outside PyTorch is taken as it was at the last."""
        memory = self.room.memory()
        now = monotonic_ns()
        if self._driver is None or now >= self._driver_next_ns or self._near:
            free, total = self.room.memory_info()
            self._driver = (free, total, max(0, total - free - memory.reserved_bytes))
            self._driver_next_ns = now + DRIVER_EVERY_NS
        free, total, outside = self._driver
        figures: dict[str, Any] = {
            "allocated_bytes": memory.allocated_bytes, "reserved_bytes": memory.reserved_bytes,
            "active_bytes": memory.active_bytes, "peak_allocated_bytes": memory.peak_allocated_bytes,
            "num_alloc_retries": memory.num_alloc_retries, "num_ooms": memory.num_ooms,
            "device_free_bytes": free, "device_total_bytes": total, "outside_pytorch_bytes": outside}
        new_peak = memory.peak_allocated_bytes if memory.peak_allocated_bytes > self._last_peak else 0
        self._last_peak = max(self._last_peak, memory.peak_allocated_bytes)
        if self.limit_source == "configured":
            used = max(memory.allocated_bytes, new_peak)
        elif self.limit_source == "fraction_cap":
            used = max(memory.reserved_bytes, new_peak)
        else:
            used = max(memory.reserved_bytes, new_peak) + outside
        figures["used_bytes"] = used
        self._near = bool(self.capacity) and used >= self.arm_fraction * self.capacity
        return figures

    # ------------------------------------------------------------------ captures
    def capture(self, step: int, phase: str | None, reason: str, signal: str = "allocated") -> Path | None:
        """A census (and on CUDA a snapshot and its HTML plot) under ``memory/``; bounded in count.

        The training thread takes the census's object walk and the snapshot object
        (``training_thread_ms`` in the capture's entry); the writer thread writes the files.
        """
        if len(self.captures) >= self.max_captures:
            self.once.warn("memory_captures", f"memory near the limit again at step {step}; at most "
                           f"{self.max_captures} captures are kept (max_memory_captures)")
            return None
        folder = self.output_dir / "memory" / f"{reason}.step{step}"
        started = monotonic_ns()
        try:
            census = self.take_census()
            snapshot = self._take_snapshot()
        except Exception as error:
            self.faults.report("memory_capture", error)
            return None
        document = {"step": step, "phase": phase, "reason": reason, "signal": signal, "memory": dict(self.latest),
                    **census}
        files = ["census.json"] + ([] if snapshot is None else ["snapshot.pickle", "snapshot.html"])

        def write() -> None:
            atomic_write_json(folder / "census.json", document)
            if snapshot is not None:
                self._write_snapshot_files(folder, "snapshot", snapshot)

        paused_ms = (monotonic_ns() - started) / 1e6
        if self._submit is not None:
            self._submit("memory_capture", write)
        else:
            write()
        self.captures.append({"reason": reason, "signal": signal, "step": step, "phase": phase, "path": str(folder),
                              "files": files, "used_bytes": self.latest.get("used_bytes", 0),
                              "training_thread_ms": round(paused_ms, 3)})
        return folder

    def take_census(self) -> dict[str, Any]:
        allocated = (f"cuda:{self.room.index}", self.room.memory().allocated_bytes) if self.cuda else None
        self.census = live_tensor_census(self.models, allocated=allocated)
        return self.census

    def on_exception(self, error: BaseException, step: int, phase: str | None) -> None:
        """If ``error`` is (or wraps) an OOM: write ``oom/`` (summary, census, the allocator's own account from the
        OOM observer, and on CUDA a snapshot: the first OOM of a run only). Outside the failing allocation, so an
        OOM the caller catches and retries costs no snapshot inside it. Never raises.

        The summary is written first and on disk before anything heavier is taken (a host OOM-kill during the
        census or the snapshot still leaves it), then again with the files that followed. The snapshot is
        streamed to its file under a size cap (never whole in memory); its HTML plot is left to the writer
        thread."""
        try:
            oom = find_oom(error)
            if oom is None:
                return
            folder = self.output_dir / "oom"
            figures = self.sample() if self.room.usable() or not self.cuda else dict(self.latest)
            summary = self._oom_summary(oom, step, phase, figures)
            atomic_write_json(folder / "summary.json", summary, durable=True)
            census = None
            try:
                census = self.take_census()
                atomic_write_json(folder / "census.json", census, durable=True)
            except Exception as census_error:
                self.faults.report("oom_census", census_error)
            files = ["census.json"] if census else []
            if not self._oom_snapshot_taken:
                self._oom_snapshot_taken = True
                files += self._write_snapshot(folder)
            if self.observed:
                atomic_write_json(folder / "observer.json", {**self.observed[-1], "count": self.observed_count},
                                  durable=True)
                files.append("observer.json")
            if self.observed_elsewhere:  # the OOM may have been another device's: say so, with its figures
                summary["other_devices_observed"] = list(self.observed_elsewhere)
            summary.update(census_totals={k: v for k, v in (census or {}).items() if k.endswith("_bytes")},
                           files=files, complete=True)
            summary["diagnosis"]["recommendation"] = " ".join(oom_recommendations(census, figures))
            atomic_write_json(folder / "summary.json", summary, durable=True)
        except Exception as dump_error:  # a failed dump never masks the user's error
            self.faults.report("oom_dump", dump_error)

    def _oom_summary(self, oom: BaseException, step: int, phase: str | None, figures: dict[str, Any]
                     ) -> dict[str, Any]:
        """The OOM's summary before the census and snapshot (``complete`` False until they are written)."""
        return {
            "error_type": type(oom).__name__, "message": str(oom)[:1000], "step": step, "phase": phase,
            "requested_bytes": requested_bytes(oom), "capacity_bytes": self.capacity, "limit": self.limit_source,
            "memory": figures, "peak": dict(self.peak), "census_totals": {}, "files": [], "complete": False,
            "diagnosis": {"id": "oom", "severity": "critical", "title": f"Out of memory at step {step}"
                          + (f" in {phase}" if phase else ""),
                          "evidence": f"{type(oom).__name__}: {str(oom)[:300]}",
                          "recommendation": " ".join(oom_recommendations(None, figures))},
        }

    # ------------------------------------------------------------------ report
    def section(self) -> dict[str, Any]:
        latest = self.latest or (self.sample() if not self.cuda else {})
        section = {"device": "cuda" if self.cuda else "cpu", "capacity_bytes": self.capacity,
                   "limit": self.limit_source, "signal": "used_bytes",
                   "peak_used_bytes": self.peak["used_bytes"],
                   "peak_step": self.peak["step"], "peak_phase": self.peak["phase"],
                   "threshold": self.threshold, "arm_fraction": self.arm_fraction,
                   "history": {"mode": self.history_mode, "recording": self.history, "owner": self.history_owner,
                               "armed": self.armed},
                   "captures": list(self.captures)}
        section.update({key: value for key, value in latest.items() if key != "used_bytes"})
        if self.series:
            section["series"] = {"step": [s for s, _ in self.series], "used_bytes": [u for _, u in self.series]}
        if self.census:
            section["census"] = {k: v for k, v in self.census.items() if k.endswith("_bytes")}
        return section

    def figures(self) -> MemoryFigures:
        """What the memory verdicts read (:func:`perfhooks.rules.memory.diagnose_memory`), copied now (training
        thread): the step samples, the capacity, the peak, the latest sample and census."""
        return MemoryFigures(tuple(self.step_samples), self.capacity, self.cuda, dict(self.peak), dict(self.latest),
                             dict(self.census) if self.census else None)

    def stop(self) -> None:
        """End of training: stop the allocation history perfhooks started (a user's is left as it is)."""
        if self.history and cuda_extras.tags_supported():
            cuda_extras.tag_allocations("")  # perfhooks' phase tags end with the run
        if self.history and self.history_owner == "perfhooks":
            cuda_extras.stop_history()
        self.history = False
        self.history_owner = None

    # ------------------------------------------------------------------ CUDA internals
    def _record_history(self) -> None:
        """Make sure an allocation history records: the user's if one already does, else perfhooks' own."""
        if self.history:
            return
        if not cuda_extras.history_supported():
            self.once.warn("memory_history", "this torch has no memory history recorder; no snapshots")
            return
        if _history_recording():
            self.history, self.history_owner = True, "user"
            return
        cuda_extras.start_history(self.history_entries)
        self.history, self.history_owner = True, "perfhooks"

    def _attach_observer(self) -> None:
        """The allocator's OOM observer, attached once per process (torch cannot detach one) once CUDA is
        initialised and history is on (earlier attachment segfaults: pytorch #107330, #102796). It notes the
        allocator's figures for the current run's monitor, found through a weak reference: it holds no run and no
        model."""
        global _observer_target
        if self._observer_attached or not self.history or not cuda_extras.is_initialized():
            return
        self._observer_attached = True
        _observer_target = weakref.ref(self)
        _attach_process_observer()

    def observed_oom(self, device: int, requested: int, limit: int, free: int) -> None:
        """What the allocator's OOM observer says, noted and nothing more: it runs inside the failing allocation
        (on every OOM, the caught and retried ones too), so the snapshot waits for the error to reach perfhooks.
        The third figure is the device's total, or the per-process cap when one is set (the call site passes
        ``set_fraction ? allowed_memory_maximum : device_total``)."""
        if self.room.index is not None and device != self.room.index:
            # another device of this process (a model spread with device_map="auto"): not this run's device's
            # OOM, and its figures are not comparable with this device's limit
            self.observed_elsewhere.append({"device": device, "requested_bytes": requested,
                                            "device_limit_bytes": limit, "device_free_bytes": free})
            del self.observed_elsewhere[:-4]
            return
        self.observed_count += 1
        self.observed[:] = [{"device": device, "requested_bytes": requested, "device_limit_bytes": limit,
                             "limit": self.limit_source if self.limit_source != "configured" else "device",
                             "device_free_bytes": free}]

    def release(self) -> None:
        """The run ended: drop the models and stop being the OOM observer's target."""
        global _observer_target
        self.models.clear()
        if _observer_target is not None and _observer_target() is self:
            _observer_target = None

    def _take_snapshot(self) -> Any:
        """The allocator's snapshot object (with the history's stacks), or None without a history."""
        return cuda_extras.snapshot() if self.history else None

    def _write_snapshot(self, folder: Path, name: str = "snapshot") -> list[str]:
        """Take and write a snapshot now (at an OOM, where the process may not live to run the writer); its HTML
        plot goes to the writer thread."""
        snapshot = self._take_snapshot()
        return [] if snapshot is None else self._write_snapshot_files(folder, name, snapshot, plot_later=True)

    def _write_snapshot_files(self, folder: Path, name: str, snapshot: Any, plot_later: bool = False) -> list[str]:
        """The snapshot's pickle, streamed to its file under ``MAX_SNAPSHOT_BYTES``, and its HTML plot (on the
        writer thread when ``plot_later``). The names of the files written."""
        try:
            atomic_write_stream(folder / f"{name}.pickle", lambda handle: pickle.dump(snapshot, handle, protocol=4),
                                limit=MAX_SNAPSHOT_BYTES, durable=True)
        except TooLarge:
            self.once.warn("snapshot_size", f"memory snapshot over {MAX_SNAPSHOT_BYTES} bytes; not written (lower "
                           "memory_history_entries)")
            return []
        files = [f"{name}.pickle"]

        def plot() -> None:
            try:
                atomic_write_bytes(folder / f"{name}.html", cuda_extras.trace_plot(snapshot).encode())
            except Exception as error:
                self.faults.report("memory_viz", error)

        if plot_later and self._submit is not None:
            self._submit("memory_plot", plot)
        else:
            plot()
        return [*files, f"{name}.html"]


def _history_recording() -> bool:
    """Whether an allocation history already records (the user's), from the allocator's own flag. A torch without
    the flag: read a snapshot's trace entries once (a history started with ``enabled="state"`` has none, so it
    can be missed there)."""
    enabled = cuda_extras.history_enabled()
    if enabled is not None:
        return enabled
    try:
        return any(cuda_extras.snapshot().get("device_traces") or [])
    except Exception:
        return False


#: The monitor the process's OOM observer writes for (the current CUDA run's), if any.
_observer_target: weakref.ref[MemoryMonitor] | None = None
_observer_attached = False


def _attach_process_observer() -> None:
    global _observer_attached
    if _observer_attached:
        return
    _observer_attached = True
    cuda_extras.attach_oom_observer(_on_out_of_memory)


def _on_out_of_memory(device: int, requested: int, limit: int, free: int) -> None:
    monitor = _observer_target() if _observer_target is not None else None
    if monitor is not None:
        monitor.observed_oom(device, requested, limit, free)
