"""The matmul dtype a framework's precision setting means (for the peak that applies to MFU)."""

from __future__ import annotations

from typing import Any

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
