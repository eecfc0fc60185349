"""The machine and versions a benchmark ran on: every absolute figure is printed next to it."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any


def machine_info() -> dict[str, Any]:
    from perfhooks.device.describe import cpu_model

    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    versions = {}
    for package in ("perfhooks", "torch", "lightning", "transformers", "accelerate", "wandb", "nvtx",
                    "HolisticTraceAnalysis", "torch-tb-profiler", "orjson", "msgspec", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {"hostname": socket.gethostname(), "cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu,
            "python": sys.version.split()[0], "platform": platform.platform(), "versions": versions}


def describe_machine() -> str:
    info = machine_info()
    return (f"{info['cpu']}, {info['cores']} cores, {info['gpu'] or 'no GPU'}, Python {info['python']}, "
            f"torch {info['versions'].get('torch', '?')}")
