"""The CUDA-only extras, each behind a check that the API exists in this torch.

- the allocation history: is one recording (the allocator's own flag, ``_cuda_isHistoryEnabled``), start, stop;
- the allocator snapshot (``torch.cuda.memory._snapshot``) and its HTML plot (``torch.cuda._memory_viz``);
- the OOM observer (``_cuda_attach_out_of_memory_observer``; torch cannot detach one);
- the Nsight Systems capture range (``cudaProfilerStart``/``cudaProfilerStop``);
- allocation tags (``_set_memory_metadata``): the phase each allocation was made in, shown by the snapshot;
- an interval timer for completed events that releases the GIL (``cudaEventElapsedTime`` through ctypes, from the
  ``libcudart`` torch loaded).

A missing API makes the feature say so once (the caller's ``Once``) and step aside; nothing here raises
``AttributeError`` into a run.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

#: The OOM observer's arguments, as ``c10/cuda/CUDACachingAllocator.h`` declares ``OutOfMemoryObserver``:
#: ``(device, allocated, device_total, device_free)``. The call site passes the size of the failed allocation as
#: ``allocated``, and the per-process cap (``set_per_process_memory_fraction``) as ``device_total`` when one is set.
OOM_OBSERVER_FIELDS = ("device", "requested_bytes", "device_limit_bytes", "device_free_bytes")


def _torch() -> Any:
    import torch

    return torch


def history_supported() -> bool:
    return hasattr(_torch().cuda.memory, "_record_memory_history")


def history_enabled() -> bool | None:
    """Whether the allocator records an allocation history now (the user's or ours), from the allocator's own
    flag; None when this torch cannot tell (then the caller treats a history as possibly the user's)."""
    flag = getattr(_torch()._C, "_cuda_isHistoryEnabled", None)
    if flag is None:
        return None
    return bool(flag())


def start_history(max_entries: int) -> None:
    """Record every allocation with its Python stack (``enabled="all"``), keeping ``max_entries``."""
    recorder = _torch().cuda.memory._record_memory_history
    try:
        recorder(enabled="all", stacks="python", max_entries=max_entries)
    except TypeError:  # torch before the string form
        recorder(True, max_entries=max_entries)


def stop_history() -> None:
    _torch().cuda.memory._record_memory_history(enabled=None)


def snapshot() -> dict[str, Any]:
    """The caching allocator's snapshot: ``segments``, ``device_traces`` (with the history's stacks) and
    ``allocator_settings``. Expensive with a long history: never call it inside a failing allocation."""
    return _torch().cuda.memory._snapshot()


def trace_plot(snapshot: dict[str, Any]) -> str:
    """The snapshot's allocation timeline as a self-contained HTML page (torch's own ``_memory_viz``)."""
    from torch.cuda import _memory_viz

    return _memory_viz.trace_plot(snapshot)


def attach_oom_observer(observer: Callable[[int, int, int, int], None]) -> bool:
    """Attach ``observer`` to the allocator (once per process: torch cannot detach one); whether it could."""
    attach = getattr(_torch()._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return False
    attach(observer)
    return True


def is_initialized() -> bool:
    return bool(_torch().cuda.is_initialized())


def profiler_range(start: bool) -> None:
    """Open (``cudaProfilerStart``) or close (``cudaProfilerStop``) the range ``nsys --capture-range=cudaProfilerApi``
    records."""
    from torch.cuda import profiler

    (profiler.start if start else profiler.stop)()


def tags_supported() -> bool:
    return hasattr(_torch().cuda.memory, "_set_memory_metadata")


def tag_allocations(tag: str) -> None:
    """Attach ``tag`` to every allocation from now on (shown in the snapshot); ``""`` clears it."""
    _torch().cuda.memory._set_memory_metadata(tag)


#: ``timer(start, end)``: ms between two completed events, or None when it could not say (the caller asks torch).
EventTimer = Callable[[Any, Any], "float | None"]
#: The most an event timer's answer may differ from torch's ``elapsed_time`` for the same events (ms): the same
#: runtime call beneath, so any difference means the timer reads something else.
TIMER_TOLERANCE_MS = 1e-3


def _loaded_library(stem: str) -> str | None:
    """The path of the first library mapped into this process whose file name starts with ``stem`` (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if os.path.basename(path).startswith(stem):
                    return path
    except OSError:
        return None
    return None


def event_timer(index: int, release_gil: bool = True) -> EventTimer | None:
    """An interval timer for the calling thread, bound to device ``index`` (its current device there is set once,
    so that no other device's context is made): ``cudaEventElapsedTime`` on two events' handles, called through
    ctypes from the ``libcudart`` torch already loaded.

    torch's ``Event.elapsed_time`` holds the GIL and queries both events first (``c10::Event::elapsedTime``):
    three runtime calls a mark, a few µs each, taken from a host-bound training thread by the thread that reads
    step timings. A ctypes call releases the GIL and makes the one call. For completed events only (the reader
    queries a step's newest mark first). None where this cannot work: not Linux, a HIP build, no ``libcudart``
    mapped into the process, or the device cannot be set.

    ``release_gil=False``: the call holds the GIL (``ctypes.PyDLL``), so that a training thread that releases it
    in its own device calls (``Event.record`` does) does not hand it to the reader in the middle of a batch of
    reads. ``benchmarks/gpu_check.py`` measures both (``reader_holds_gil``); the default stays until a GPU says.
    """
    torch = _torch()
    if not sys.platform.startswith("linux") or getattr(torch.version, "hip", None):
        return None
    path = _loaded_library("libcudart.so")
    if path is None:
        return None
    try:
        loader = ctypes.CDLL if release_gil else ctypes.PyDLL
        library = loader(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
        elapsed, set_device, last_error = (library.cudaEventElapsedTime, library.cudaSetDevice,
                                           library.cudaGetLastError)
    except (OSError, AttributeError):
        return None
    elapsed.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
    elapsed.restype = set_device.restype = last_error.restype = ctypes.c_int
    set_device.argtypes = [ctypes.c_int]
    if set_device(index) != 0:
        last_error()  # leave no error behind on this thread
        return None
    result = ctypes.c_float()
    into = ctypes.byref(result)

    def timer(start: Any, end: Any) -> float | None:
        first, second = getattr(start, "event_id", None), getattr(end, "event_id", None)
        if not first or not second:
            return None
        if elapsed(into, first, second) != 0:
            last_error()
            return None
        return float(result.value)

    return timer
