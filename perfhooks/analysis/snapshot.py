"""A CUDA caching-allocator snapshot (``torch.cuda.memory._dump_snapshot``), read safely and summarized.

A pickle can run code when it is loaded, and a snapshot often comes from someone else's machine. It is read with
an unpickler that admits only what a snapshot holds (dicts, lists, tuples, strings, bytes, numbers, booleans and
None): any class or function reference in the file is refused with one line, before anything runs.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

MIB = 2**20


class SnapshotError(ValueError):
    """The file is not a snapshot perfhooks can read; the message is one line naming the file."""


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it references {module}.{name}; a memory snapshot holds only data")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot in ``path``; :class:`SnapshotError` for a file that is not one, or that references code."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SnapshotError(f"{path}: {error.strerror or error}") from None
    try:
        snapshot = _DataOnly(io.BytesIO(data)).load()
    except pickle.UnpicklingError as error:
        raise SnapshotError(f"{path}: refused: {error}") from None
    except Exception as error:
        raise SnapshotError(f"{path}: not a pickle ({type(error).__name__}: {error})") from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise SnapshotError(f"{path}: a pickle, but not a memory snapshot (no 'segments' list)")
    return snapshot


def summarize_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Reserved, allocated and cached-but-free bytes per device, the largest free block, the segments' count by
    pool, and whether an allocation history was recorded (its entries and OOMs)."""
    devices: dict[int, dict[str, Any]] = {}
    for segment in snapshot["segments"]:
        device = devices.setdefault(int(segment.get("device", 0)), {
            "segments": 0, "small_segments": 0, "reserved_bytes": 0, "allocated_bytes": 0,
            "largest_free_block_bytes": 0, "blocks": 0})
        device["segments"] += 1
        device["small_segments"] += segment.get("segment_type") == "small"
        device["reserved_bytes"] += int(segment.get("total_size", 0))
        device["allocated_bytes"] += int(segment.get("allocated_size", 0))
        for block in segment.get("blocks") or []:
            device["blocks"] += 1
            if block.get("state") == "inactive":
                device["largest_free_block_bytes"] = max(device["largest_free_block_bytes"], int(block["size"]))
    for device in devices.values():
        device["cached_free_bytes"] = device["reserved_bytes"] - device["allocated_bytes"]
        device["fragmentation"] = (device["cached_free_bytes"] / device["reserved_bytes"]
                                   if device["reserved_bytes"] else 0.0)
    traces = snapshot.get("device_traces") or []
    entries = [entry for trace in traces for entry in trace]
    return {"devices": {str(k): v for k, v in sorted(devices.items())},
            "history": {"entries": len(entries), "ooms": sum(e.get("action") == "oom" for e in entries)},
            "allocator_settings": snapshot.get("allocator_settings") or {}}


def format_snapshot(summary: dict[str, Any]) -> str:
    lines = []
    for index, device in summary["devices"].items():
        lines.append(f"device {index}: reserved {device['reserved_bytes'] / MIB:.1f} MiB in {device['segments']} "
                     f"segments ({device['small_segments']} small), allocated {device['allocated_bytes'] / MIB:.1f} "
                     f"MiB, cached but free {device['cached_free_bytes'] / MIB:.1f} MiB "
                     f"({device['fragmentation']:.0%}), largest free block "
                     f"{device['largest_free_block_bytes'] / MIB:.1f} MiB")
    history = summary["history"]
    lines.append(f"allocation history: {history['entries']} entries, {history['ooms']} OOM(s)" if history["entries"]
                 else "allocation history: none recorded (start one with torch.cuda.memory._record_memory_history, "
                      "or perfhooks' memory_history=True, to see where each block was allocated)")
    return "\n".join(lines)
