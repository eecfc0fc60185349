"""Shared fixtures: the hardware gate, the NVTX recorder library, tiny Lightning models."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

#: One OpenMP thread per torch process, in each pytest worker and every script a test starts (they inherit it),
#: unless the environment sets its own. Two workers on a 2-core machine, each torch process with two OpenMP
#: threads that spin-wait for each other, slowed every op about 20-fold while both ran torch at once: a compiled
#: loop's steady steps took 85 ms against its recompiles' 60, and its shape churn read as step time variance. The
#: suite took 457 s with it against 513 s without (idle, 2026-11-28). Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(TESTS / "integrations"))
sys.path.insert(0, str(TESTS / "analysis"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """One hardware gate: ``cuda``-marked tests skip cleanly without a GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def nvtx_include_dir() -> Path | None:
    """The NVTX headers shipped by the ``nvidia-nvtx`` wheel (a dev dependency)."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for header in sorted(Path(root).glob("*/include/nvtx3/nvToolsExt.h")):
            return header.parent.parent
    return None


@pytest.fixture(scope="session")
def nvtx_recorder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the NVTX injection library with gcc; the path to the ``.so``."""
    include = nvtx_include_dir()
    if include is None:
        pytest.fail("NVTX headers not found: install the dev extra (pip install -e '.[dev]'), it brings nvidia-nvtx")
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.fail("no C compiler (gcc) to build the NVTX injection library")
    library = tmp_path_factory.mktemp("nvtx") / "libnvtx_recorder.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", f"-I{include}", "-o", str(library),
                    str(TESTS / "nvtx_injection" / "nvtx_recorder.c"), "-lpthread"], check=True)
    return library


@pytest.fixture(params=["simulated", pytest.param("real", marks=pytest.mark.cuda)])
def gpu(request: pytest.FixtureRequest):
    """A CUDA device to test on: the simulated one always, the real one where a GPU is present (``cuda``).
    Both take ``run(ms)``, ``alloc(bytes)`` and ``free(handle)``; ``gpu.simulated`` tells them apart."""
    from simulated_gpu import RealGpu, simulated_cuda

    if request.param == "real":
        yield RealGpu()
        return
    with simulated_cuda(memory_bytes=8 << 30) as simulated:
        yield simulated


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``WANDB_MODE=offline``; runs, cache, staging and settings under ``tmp_path/wandb``. Yields that folder."""
    wandb = pytest.importorskip("wandb")
    root = tmp_path / "wandb"
    root.mkdir()
    for name, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"),
                      ("WANDB_CONFIG_DIR", "config"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(name, str(root / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "perfhooks-tests")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    wandb.teardown()  # settings are read at the first setup of a process: start from this test's
    yield root
    if wandb.run is not None:
        wandb.finish()
    wandb.teardown()
