"""Memory telemetry, captures near the limit, and what was alive at an OOM.

Sampling costs no host sync: CUDA figures come from the caching allocator's counters, CPU figures
from ``/proc/self/statm``. Both are read at phase boundaries at most every ``memory_poll_s``
seconds, so the step and phase of the peak are known to that resolution.

**The signal.** Near the limit means *allocated* bytes (CUDA; resident or virtual size on CPU) at
``threshold`` of capacity, or the caching allocator retrying (``num_alloc_retries`` rising: it had
to free its cache and call cudaMalloc again). Reserved memory is not the signal: the allocator keeps
it near capacity in healthy runs by design; reserved/allocated stays the fragmentation signal.

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
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.faults import FaultLog, Once
from perfhooks.memory.live_tensors import live_tensor_census
from perfhooks.memory.oom import find_oom, oom_recommendations, requested_bytes
from perfhooks.report.files import atomic_write_bytes, atomic_write_json
from perfhooks.rules.verdicts import make

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Usage must fall this far (fraction of capacity) below the threshold before the next capture.
HYSTERESIS = 0.05
#: Largest snapshot pickle written (bytes); bigger ones are skipped with a warning.
MAX_SNAPSHOT_BYTES = 512 * 2**20
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

    def __init__(self, output_dir: Path, on_cuda: bool, faults: FaultLog, once: Once, *, threshold: float,
                 capacity_bytes: int | None, poll_s: float, history: bool | None, history_entries: int,
                 max_captures: int, arm_fraction: float = 0.75,
                 submit: Callable[[str, Callable[[], None]], None] | None = None) -> None:
        import torch

        self.torch = torch
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
        self.output_dir = output_dir
        self.cuda = on_cuda and torch.cuda.is_available()
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
        self.census: dict[str, Any] | None = None
        self._capture_ready = True  # a near-limit capture may fire (re-armed 5 points below the threshold)
        self._next_ns = 0
        self._observer_attached = False
        self.history = False
        if self.cuda:
            self.limit_source = "device"
            self.capacity = capacity_bytes or torch.cuda.mem_get_info()[1]
            if self.history_mode == "from_start":
                self._record_history()
        else:
            self.capacity, self.limit_source = (capacity_bytes, "configured") if capacity_bytes else cpu_limit()

    # ------------------------------------------------------------------ sampling
    def observe(self, step: int, phase: str | None) -> None:
        """At a phase boundary: sample (rate-limited), track the peak, capture on crossing the threshold."""
        now = time.monotonic_ns()
        if now < self._next_ns:
            return
        self._next_ns = now + self.poll_ns
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

    def arm(self, step: int, signal: str) -> None:
        """Memory is approaching the limit: start the allocation history (CUDA) so a later capture has stacks."""
        self.armed = {"step": step, "signal": signal}
        if self.cuda:
            self._record_history()

    def sample(self) -> dict[str, Any]:
        if self.cuda:
            figures = _cuda_figures(self.torch)
            figures["used_bytes"] = figures["allocated_bytes"]
            self._attach_observer()
        else:
            figures = cpu_usage()
            figures["used_bytes"] = figures["vms_bytes" if self.limit_source == "rlimit_as" else "rss_bytes"]
        self.latest = figures
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
        started = time.perf_counter_ns()
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

        paused_ms = (time.perf_counter_ns() - started) / 1e6
        if self._submit is not None:
            self._submit("memory_capture", write)
        else:
            write()
        self.captures.append({"reason": reason, "signal": signal, "step": step, "phase": phase, "path": str(folder),
                              "files": files, "used_bytes": self.latest.get("used_bytes", 0),
                              "training_thread_ms": round(paused_ms, 3)})
        return folder

    def take_census(self) -> dict[str, Any]:
        self.census = live_tensor_census(self.models)
        return self.census

    def on_exception(self, error: BaseException, step: int, phase: str | None) -> None:
        """If ``error`` is (or wraps) an OOM: write ``oom/`` (summary, census, snapshot). Never raises."""
        try:
            oom = find_oom(error)
            if oom is None:
                return
            folder = self.output_dir / "oom"
            figures = self.sample()
            census = None
            try:
                census = self.take_census()
                atomic_write_json(folder / "census.json", census)
            except Exception as census_error:
                self.faults.report("oom_census", census_error)
            snapshot_files = self._write_snapshot(folder)
            summary = {
                "error_type": type(oom).__name__, "message": str(oom)[:1000], "step": step, "phase": phase,
                "requested_bytes": requested_bytes(oom), "capacity_bytes": self.capacity, "memory": figures,
                "peak": dict(self.peak), "census_totals": {k: v for k, v in (census or {}).items() if
                                                           k.endswith("_bytes")},
                "files": ["census.json", *snapshot_files] if census else snapshot_files,
                "diagnosis": {"id": "oom", "severity": "critical", "title": f"Out of memory at step {step}"
                              + (f" in {phase}" if phase else ""),
                              "evidence": f"{type(oom).__name__}: {str(oom)[:300]}",
                              "recommendation": " ".join(oom_recommendations(census, figures))},
            }
            atomic_write_json(folder / "summary.json", summary)
        except Exception as dump_error:  # a failed dump never masks the user's error
            self.faults.report("oom_dump", dump_error)

    # ------------------------------------------------------------------ report
    def section(self) -> dict[str, Any]:
        latest = self.latest or (self.sample() if not self.cuda else {})
        section = {"device": "cuda" if self.cuda else "cpu", "capacity_bytes": self.capacity,
                   "limit": self.limit_source, "signal": "allocated_bytes" if self.cuda else "used_bytes",
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

    def diagnoses(self, memory_fraction: float) -> list[dict[str, Any]]:

        out = []
        used = self.peak["used_bytes"]
        if self.capacity and used / self.capacity >= memory_fraction:
            out.append(make(
                "memory_near_limit", "warning", "Memory use came close to the limit",
                f"peak {used / 2**30:.2f} GiB of {self.capacity / 2**30:.2f} GiB ({used / self.capacity:.0%}) at "
                f"step {self.peak['step']} in {self.peak['phase']}; threshold {memory_fraction:.0%}",
                0.0, " ".join(oom_recommendations(self.census, self.latest)[:2]),
                used_fraction=used / self.capacity))
        reserved, allocated = self.latest.get("reserved_bytes", 0), self.latest.get("allocated_bytes", 0)
        if allocated and reserved / allocated > 1.5 and self.latest.get("num_alloc_retries", 0) > 0:
            out.append(make(
                "memory_fragmentation", "warning", "The caching allocator is fragmented",
                f"reserved/allocated {reserved / allocated:.2f} with {self.latest['num_alloc_retries']} allocator "
                "retries; thresholds 1.5 and 0", 0.0,
                "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and avoid tensors whose size changes "
                "every step.", reserved_over_allocated=reserved / allocated))
        census = self.census
        if census and census.get("total_bytes") and census["activations_other_bytes"] > census["total_bytes"] / 2:
            share = census["activations_other_bytes"] / census["total_bytes"]
            out.append(make(
                "activations_dominate", "info", "Activations hold most of the memory",
                f"activations and other tensors are {share:.0%} of live tensor bytes; threshold 50%", 0.0,
                "Activation checkpointing trades recompute for memory: torch.utils.checkpoint.checkpoint(block, x, "
                "use_reentrant=False).", activations_share=share))
        return out

    def stop(self) -> None:
        """End of training: stop the allocation history perfhooks started (a user's is left as it is)."""
        if self.history and self.history_owner == "perfhooks":
            self.torch.cuda.memory._record_memory_history(enabled=None)
        self.history = False
        self.history_owner = None

    # ------------------------------------------------------------------ CUDA internals
    def _record_history(self) -> None:
        """Make sure an allocation history records: the user's if one already does, else perfhooks' own."""
        if self.history:
            return
        if _history_recording(self.torch):
            self.history, self.history_owner = True, "user"
            return
        recorder = getattr(self.torch.cuda.memory, "_record_memory_history", None)
        if recorder is None:
            self.once.warn("memory_history", "this torch has no memory history recorder; no snapshots")
            return
        try:
            recorder(enabled="all", stacks="python", max_entries=self.history_entries)
        except TypeError:  # older signature
            recorder(True, max_entries=self.history_entries)
        self.history, self.history_owner = True, "perfhooks"

    def _attach_observer(self) -> None:
        """The allocator's OOM observer, attached once per process (torch cannot detach one) once CUDA is
        initialised and history is on (earlier attachment segfaults: pytorch #107330, #102796). It writes
        for the current run's monitor, found through a weak reference: it holds no run and no model."""
        global _observer_target
        if self._observer_attached or not self.history or not self.torch.cuda.is_initialized():
            return
        self._observer_attached = True
        _observer_target = weakref.ref(self)
        _attach_process_observer(self.torch)

    def observed_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """What the process's OOM observer does for this run: the snapshot and the failing allocation."""
        try:
            folder = self.output_dir / "oom"
            self._write_snapshot(folder, name="observer_snapshot")
            atomic_write_json(folder / "observer.json", {"device": device, "requested_bytes": alloc,
                                                         "device_allocated_bytes": device_allocated,
                                                         "device_free_bytes": device_free})
        except Exception as error:
            self.faults.report("oom_observer", error)

    def release(self) -> None:
        """The run ended: drop the models and stop being the OOM observer's target."""
        global _observer_target
        self.models.clear()
        if _observer_target is not None and _observer_target() is self:
            _observer_target = None

    def _take_snapshot(self) -> Any:
        """The allocator's snapshot object (with the history's stacks), or None without a history."""
        return self.torch.cuda.memory._snapshot() if self.history else None

    def _write_snapshot(self, folder: Path, name: str = "snapshot") -> list[str]:
        """Take and write a snapshot now (at an OOM, where the process may not live to run the writer)."""
        snapshot = self._take_snapshot()
        return [] if snapshot is None else self._write_snapshot_files(folder, name, snapshot)

    def _write_snapshot_files(self, folder: Path, name: str, snapshot: Any) -> list[str]:
        data = pickle.dumps(snapshot, protocol=4)
        if len(data) > MAX_SNAPSHOT_BYTES:
            self.once.warn("snapshot_size", f"memory snapshot of {len(data)} bytes is over {MAX_SNAPSHOT_BYTES}; "
                           "not written (lower memory_history_entries)")
            return []
        atomic_write_bytes(folder / f"{name}.pickle", data)
        files = [f"{name}.pickle"]
        try:
            from torch.cuda import _memory_viz

            atomic_write_bytes(folder / f"{name}.html", _memory_viz.trace_plot(snapshot).encode())
            files.append(f"{name}.html")
        except Exception as error:
            self.faults.report("memory_viz", error)
        return files


def _cuda_figures(torch: Any) -> dict[str, int]:
    """The allocator's figures from its nested stats (the flat ``memory_stats()`` dict is built in Python,
    about 100 entries per call)."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        stats = raw(torch.cuda.current_device())

        def get(key: str, part: str = "current") -> int:
            return int(stats.get(key, {}).get("all", {}).get(part, 0))

        return {"allocated_bytes": get("allocated_bytes"), "reserved_bytes": get("reserved_bytes"),
                "active_bytes": get("active_bytes"), "peak_allocated_bytes": get("allocated_bytes", "peak"),
                "num_alloc_retries": int(stats.get("num_alloc_retries", 0)), "num_ooms": int(stats.get("num_ooms", 0))}
    stats = torch.cuda.memory_stats()
    return {"allocated_bytes": stats.get("allocated_bytes.all.current", 0),
            "reserved_bytes": stats.get("reserved_bytes.all.current", 0),
            "active_bytes": stats.get("active_bytes.all.current", 0),
            "peak_allocated_bytes": stats.get("allocated_bytes.all.peak", 0),
            "num_alloc_retries": stats.get("num_alloc_retries", 0), "num_ooms": stats.get("num_ooms", 0)}


def _history_recording(torch: Any) -> bool:
    """Whether an allocation history already records (the user's): its snapshot has trace entries. Read once,
    when perfhooks would start its own (torch has no public getter for this)."""
    try:
        return any(torch.cuda.memory._snapshot().get("device_traces") or [])
    except Exception:
        return False


#: The monitor the process's OOM observer writes for (the current CUDA run's), if any.
_observer_target: weakref.ref[MemoryMonitor] | None = None
_observer_attached = False


def _attach_process_observer(torch: Any) -> None:
    global _observer_attached
    if _observer_attached:
        return
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    _observer_attached = True
    if attach is not None:
        attach(_on_out_of_memory)


def _on_out_of_memory(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    monitor = _observer_target() if _observer_target is not None else None
    if monitor is not None:
        monitor.observed_oom(device, alloc, device_allocated, device_free)
