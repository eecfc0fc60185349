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
