"""What the run trains on, described for the report."""

from __future__ import annotations

import platform
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_device(device: Any) -> dict[str, Any]:
    """``{"type": "cuda"|"cpu"|..., "name": ...}`` (plus ``index`` on CUDA), for a ``torch.device`` or a string."""
    import torch

    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {"type": "cuda", "name": torch.cuda.get_device_name(index), "index": index}
    if device.type == "cpu":
        return {"type": "cpu", "name": _cpu_model()}
    return {"type": device.type, "name": str(device)}
