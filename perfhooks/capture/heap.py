"""Give the C heap's freed pages back to the OS while a capture window records (glibc only).

Recording, torch's profiler keeps a small allocation for each event until the window ends. Those live above the
step's freed tensors in glibc's heap, so glibc cannot trim it, and each recorded step adds its transient tensors'
size to the process's RSS: on Lightning's demo Transformer, about 50 MB a step, 200 MB for a default window, kept
until the process ends. ``malloc_trim(0)`` after each recorded step returns them (about 17 ms on that heap; the
window's steps are perfhooks' own and left out of the steady figures either way).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

_trim: Any = None
_looked = False


def release_freed_heap() -> bool:
    """``malloc_trim(0)``: True if the C library has it (glibc), False elsewhere (then nothing happens)."""
    global _trim, _looked
    if not _looked:
        _looked = True
        try:
            name = ctypes.util.find_library("c")
            library = ctypes.CDLL(name) if name else None
            _trim = getattr(library, "malloc_trim", None)
            if _trim is not None:
                _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except OSError:
            _trim = None
    if _trim is None:
        return False
    _trim(0)
    return True


_PAGE = None


def rss_bytes() -> int | None:
    """This process's resident set now (bytes, ``/proc/self/statm``); None where it cannot be read."""
    global _PAGE
    try:
        if _PAGE is None:
            import os

            _PAGE = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int | None:
    """This process's resident high-water mark (bytes, ``VmHWM`` of ``/proc/self/status``; never reset by
    perfhooks: the program may read it); None where it cannot be read."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class WindowMemory:
    """What a capture window adds to the process's RSS: sampled at its open and at each of its steps (and the
    high-water mark, where the window set a new one), against a bound past which the window stops early: the larger
    of ``limit_bytes`` and a quarter of the RSS before the window (None: no bound)."""

    def __init__(self, limit_bytes: int | None) -> None:
        self.limit_bytes = limit_bytes
        self.start: int | None = None
        self.start_peak: int | None = None
        self.peak = 0
        self.bound: int | None = None

    def opened(self) -> None:
        self.start, self.start_peak = rss_bytes(), peak_rss_bytes()
        self.peak = self.start or 0
        self.bound = (max(self.limit_bytes, (self.start or 0) // 4) if self.limit_bytes is not None else None)

    def over_bound(self) -> int | None:
        """Sample RSS now; the bytes added so far when they pass the bound, else None."""
        now = rss_bytes()
        if now is None or self.start is None:
            return None
        self.peak = max(self.peak, now)
        added = now - self.start
        return added if self.bound is not None and added > self.bound else None

    def closed(self) -> dict[str, int]:
        """``{rss_before_bytes, peak_rss_added_bytes}`` (empty where RSS cannot be read): the most the window
        added that a sample or a new high-water mark saw."""
        if self.start is None:
            return {}
        self.over_bound()
        peak, high = self.peak, peak_rss_bytes()
        if high is not None and self.start_peak is not None and high > self.start_peak:
            peak = max(peak, high)  # a new high-water mark for the process, set during the window
        found = {"rss_before_bytes": self.start, "peak_rss_added_bytes": max(0, peak - self.start)}
        self.start = None
        return found
