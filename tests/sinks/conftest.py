"""W&B in offline mode, with every file it writes under the test's tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest


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
