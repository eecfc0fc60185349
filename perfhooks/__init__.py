"""perfhooks: make a PyTorch training run explain its own performance.

Names are imported lazily, so ``perfhooks analyze`` starts without importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Action": "perfhooks.capture.schedule",
    "Schedule": "perfhooks.capture.schedule",
    "PerfConfig": "perfhooks.config",
    "Engine": "perfhooks.runtime.engine",
    "PerfhooksWarning": "perfhooks.faults",
    "PHASES": "perfhooks.events",
    "Thresholds": "perfhooks.rules",
    "profile": "perfhooks.runtime.loops.plain_loop",
}
__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'perfhooks' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
