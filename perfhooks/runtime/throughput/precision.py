"""The matmul dtype a framework's precision setting means, or the one ``torch.autocast`` runs the step in (for the
peak that applies to MFU)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_BY_SETTING = {
    # Lightning Trainer(precision=...)
    "bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16",
    "16-mixed": "fp16", "16-true": "fp16", "16": "fp16", "fp16": "fp16",
    "transformer-engine": "fp8", "transformer-engine-float16": "fp8", "fp8": "fp8",
    # accelerate mixed_precision
    "no": None, "32-true": None, "32": None, "64-true": None, "64": None,
}


def matmul_dtype(setting: Any) -> str | None:
    """``bf16``, ``fp16`` or ``fp8`` for a mixed/low precision setting; None for full precision or unknown."""
    return _BY_SETTING.get(str(setting).strip().lower()) if setting is not None else None


_AUTOCAST = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}


def autocast_dtype(device_type: str) -> str | None:
    """``bf16`` or ``fp16`` while ``torch.autocast(device_type)`` is on in the calling thread (a forward inside
    ``with torch.autocast(...)``: the nanoGPT pattern); None when it is off or this torch cannot say."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return _AUTOCAST.get(str(torch.get_autocast_dtype(device_type)))
    except (TypeError, RuntimeError, AttributeError):  # an older torch, or a device type autocast does not know
        return None


def autocast_probe(device_type: str) -> Callable[[], bool] | None:
    """A check that ``torch.autocast(device_type)`` is on in the calling thread, as one C call (asked at every
    training forward until it says yes); None when this torch cannot say."""
    try:
        torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError, AttributeError):
        return None
    return functools.partial(torch.is_autocast_enabled, device_type)
