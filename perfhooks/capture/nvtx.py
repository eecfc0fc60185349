"""NVTX ranges for phases and modules, seen by Nsight Systems.

NVTX goes through the ``nvtx`` package, which works on CPU builds of torch too (``torch.cuda.nvtx`` raises
there). With no NVTX tool attached, the package hands out a dummy domain and a range costs one attribute lookup.
"""

from __future__ import annotations

from typing import Any

from perfhooks.events import PHASE_COLORS

NVTX_DOMAIN = "perfhooks"


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
