"""Recognise an out-of-memory error, however it arrives, and describe it for the dump."""

from __future__ import annotations

import re

_CPU_OOM = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
_SIZE = re.compile(r"(?:allocate|alloc)[^0-9]*([0-9][0-9.,]*)\s*(bytes|[KMGT]i?B)\b", re.IGNORECASE)
_UNITS = {"bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def _is_oom_itself(error: BaseException) -> bool:
    import torch

    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in _CPU_OOM)


def find_oom(error: BaseException) -> BaseException | None:
    """The OOM in ``error`` or in its ``__cause__``/``__context__`` chain (cycles end), else ``None``."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if _is_oom_itself(current):
            return current
        pending += [current.__cause__, current.__context__]  # type: ignore[list-item]
    return None


def requested_bytes(error: BaseException) -> int | None:
    """The failing allocation's size, where the message says it."""
    match = _SIZE.search(str(error))
    if not match:
        return None
    number = float(match.group(1).replace(",", ""))
    return int(number * _UNITS.get(match.group(2).lower(), 1))
