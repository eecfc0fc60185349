"""Dense peak FLOP/s of accelerators, per matmul dtype, from their vendors' datasheets; matched on the names
``torch.cuda.get_device_name()`` returns and that traces carry in ``deviceProperties``.

Figures are dense (NVIDIA's datasheets give Tensor Core figures "with sparsity": halved here) and in TFLOP/s.
A device or dtype not in the table has no peak: perfhooks then reports no MFU and says which peak is missing,
never a guess. Left out on purpose: the A10G and the B300 (no datasheet figure to cite), an "MI250X/MI250"
name (the two differ) and PCIe variants of the H800.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Peak:
    """A device's dense peaks (TFLOP/s by dtype) and where they come from."""

    device: str
    tflops: dict[str, float]
    source: str


# (name pattern on the normalised device name, peak); the first match wins, so variants come before the family.
_TABLE: tuple[tuple[str, Peak], ...] = (
    # NVIDIA V100 datasheet (2020): SXM2 FP32 15.7, Tensor FP16 125; PCIe 14 and 112; V100S PCIe 16.4 and 130
    (r"V100S", Peak("V100S PCIe", {"fp32": 16.4, "fp16": 130.0}, "NVIDIA V100 datasheet")),
    (r"V100.*PCIE", Peak("V100 PCIe", {"fp32": 14.0, "fp16": 112.0}, "NVIDIA V100 datasheet")),
    (r"V100", Peak("V100 SXM2", {"fp32": 15.7, "fp16": 125.0}, "NVIDIA V100 datasheet")),
    # NVIDIA T4 datasheet: FP32 8.1, mixed FP16/FP32 65
    (r"\bT4\b", Peak("T4", {"fp32": 8.1, "fp16": 65.0}, "NVIDIA T4 datasheet")),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 62.5 (125 sparse), BF16/FP16 125 (250 sparse)
    (r"\bA10\b", Peak("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}, "NVIDIA A10 datasheet")),
    # NVIDIA A100 datasheet (PCIe and SXM alike): FP32 19.5, TF32 156, BF16/FP16 312 (dense); PG509 is the SXM4 board
    (r"A100", Peak("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, "NVIDIA A100 datasheet")),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* (* with sparsity)
    (r"\bL4\b", Peak("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
                    "NVIDIA L4 datasheet")),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 366*, BF16/FP16 733*, FP8 1466*
    (r"L40S", Peak("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 366.5, "fp16": 366.5, "fp8": 733.0},
                   "NVIDIA L40S datasheet")),
    # NVIDIA H100/H200 NVL datasheets: FP32 60, TF32 835*, BF16/FP16 1671*, FP8 3341*
    (r"H[12]00.*NVL", Peak("H100/H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5,
                                             "fp8": 1670.5}, "NVIDIA H100 NVL / H200 NVL datasheets")),
    # NVIDIA H100 datasheet, PCIe: FP32 51, TF32 756*, BF16/FP16 1513*, FP8 3026*
    (r"H100.*PCIE", Peak("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
                         "NVIDIA H100 datasheet")),
    (r"H800.*PCIE", Peak("H800 PCIe", {}, "not in the table")),
    # NVIDIA H100 datasheet, SXM (also H800 SXM and H200 SXM): FP32 67, TF32 989*, BF16/FP16 1979*, FP8 3958*
    (r"H100|H800|H200", Peak("H100/H200 SXM", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                                              "fp8": 1979.0}, "NVIDIA H100 and H200 datasheets")),
    # NVIDIA GB200 NVL72 datasheet, per GPU: TF32 2.5 PF*, BF16/FP16 5 PF*, FP8 10 PF*
    (r"GB200", Peak("GB200", {"tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0},
                    "NVIDIA GB200 NVL72 datasheet")),
    # NVIDIA HGX B200 datasheet, per GPU: TF32 2.2 PF*, BF16/FP16 4.5 PF*, FP8 9 PF*
    (r"\bB200\b", Peak("B200", {"tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
                       "NVIDIA HGX B200 datasheet")),
    # AMD Instinct MI250X datasheet: FP32 matrix 95.7, FP16/BF16 383
    (r"MI250X(?!/)", Peak("MI250X", {"fp32": 95.7, "bf16": 383.0, "fp16": 383.0}, "AMD Instinct MI250X datasheet")),
    # AMD Instinct MI300X / MI325X datasheets: FP32 matrix 163.4, TF32 653.7, BF16/FP16 1307.4, FP8 2614.9
    (r"MI300X|MI325X", Peak("MI300X/MI325X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
                                          "fp8": 2614.9}, "AMD Instinct MI300X and MI325X datasheets")),
)


def normalise(name: str) -> str:
    """Upper case, separators as spaces: "NVIDIA A100-SXM4-80GB" -> "NVIDIA A100 SXM4 80GB"."""
    return re.sub(r"[\s_\-]+", " ", name.upper()).strip()


def find_peak(device_name: str | None) -> Peak | None:
    """The table's row for ``device_name``, or None."""
    if not device_name:
        return None
    name = normalise(device_name)
    for pattern, peak in _TABLE:
        if re.search(pattern, name):
            return peak if peak.tflops else None
    return None


def peak_flops(device_name: str | None, dtype: str) -> float | None:
    """Dense peak FLOP/s of ``device_name`` for matmuls in ``dtype`` (one of :data:`DTYPES`), or None."""
    peak = find_peak(device_name)
    value = peak.tflops.get(dtype) if peak is not None else None
    return value * 1e12 if value else None
