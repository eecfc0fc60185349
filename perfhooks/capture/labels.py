"""``torch.profiler`` labels (``record_function``) for phases, opened only while a profiler is recording:
outside a window they would cost ~15 µs each for nothing.
"""

from __future__ import annotations

from typing import Any

import torch.autograd.profiler as autograd_profiler


def profiler_recording() -> bool:
    """True while any ``torch.profiler`` session is recording (ours or another's)."""
    return autograd_profiler._is_profiler_enabled


class ProfilerLabels:
    """``record_function`` labels for phases, opened only while a profiler records."""

    def __init__(self) -> None:
        self._open: Any = None
        #: A label is open (a plain attribute: the tracker reads it at every phase change).
        self.is_open = False

    def enter(self, name: str) -> None:
        if self._open is None and autograd_profiler._is_profiler_enabled:
            label = autograd_profiler.record_function(name)
            label.__enter__()
            self._open, self.is_open = label, True

    def exit(self) -> None:
        label, self._open, self.is_open = self._open, None, False
        if label is not None:
            label.__exit__(None, None, None)
