"""``benchmarks/gpu_check.py`` works without a GPU: a dry run on the CPU writes its one JSON file and says so."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_dry_run_writes_every_part(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path),
                           "--dry-run"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["dry_run"] is True and result["why_dry"] in ("no CUDA device", "--dry-run")
    for part in ("launch_bound", "lightning_gpt"):
        assert set(result[part]["ratio"]) == {"bare", "defaults", "no_window", "no_flop_count", "no_window_analysis",
                                              "no_memory", "no_nvtx"}
    assert "DRY RUN" in done.stdout
