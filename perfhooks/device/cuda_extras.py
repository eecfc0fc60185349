"""The CUDA-only extras, each behind a check that the API exists in this torch.

- the allocation history: is one recording (the allocator's own flag, ``_cuda_isHistoryEnabled``), start, stop;
- the allocator snapshot (``torch.cuda.memory._snapshot``) and its HTML plot (``torch.cuda._memory_viz``);
- the OOM observer (``_cuda_attach_out_of_memory_observer``; torch cannot detach one);
- the Nsight Systems capture range (``cudaProfilerStart``/``cudaProfilerStop``);
- allocation tags (``_set_memory_metadata``): the phase each allocation was made in, shown by the snapshot.

A missing API makes the feature say so once (the caller's ``Once``) and step aside; nothing here raises
``AttributeError`` into a run.
"""

from __future__ import annotations

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
