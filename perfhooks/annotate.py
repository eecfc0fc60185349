"""NVTX ranges (seen by Nsight Systems) and ``torch.profiler`` labels for phases and modules.

NVTX goes through the ``nvtx`` package, which works on CPU builds of torch too
(``torch.cuda.nvtx`` raises there). With no NVTX tool attached, the package hands out a
dummy domain and a range costs one attribute lookup. Profiler labels
(``record_function``) are only opened while a profiler is recording: outside a window they
would cost ~15 µs each for nothing.
"""

from __future__ import annotations

from typing import Any

import torch.autograd.profiler as autograd_profiler

from perfhooks.phases import PHASE_COLORS

NVTX_DOMAIN = "perfhooks"


def profiler_recording() -> bool:
    """True while any ``torch.profiler`` session is recording (ours or another's)."""
    return autograd_profiler._is_profiler_enabled


class NvtxRanges:
    """Push/pop NVTX ranges in the ``perfhooks`` domain with pre-registered names and colours."""

    def __init__(self, enabled: bool = True) -> None:
        self._domain: Any = None
        self._attributes: dict[str, Any] = {}
        if not enabled:
            return
        import nvtx

        domain = nvtx.get_domain(NVTX_DOMAIN)
        if getattr(domain, "handle", None) is None:  # DummyDomain: no tool attached
            return
        self._domain = domain

    @property
    def active(self) -> bool:
        return self._domain is not None

    def push(self, name: str) -> None:
        if self._domain is None:
            return
        attributes = self._attributes.get(name)
        if attributes is None:
            attributes = self._domain.get_event_attributes(message=name, color=PHASE_COLORS.get(name, 0xFF7F8C8D))
            self._attributes[name] = attributes
        self._domain.push_range(attributes)

    def pop(self) -> None:
        if self._domain is not None:
            self._domain.pop_range()


class ProfilerLabels:
    """``record_function`` labels for phases, opened only while a profiler records."""

    def __init__(self) -> None:
        self._open: Any = None

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def enter(self, name: str) -> None:
        if self._open is None and autograd_profiler._is_profiler_enabled:
            label = autograd_profiler.record_function(name)
            label.__enter__()
            self._open = label

    def exit(self) -> None:
        label, self._open = self._open, None
        if label is not None:
            label.__exit__(None, None, None)
