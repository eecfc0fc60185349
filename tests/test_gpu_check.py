"""``benchmarks/gpu_check.py`` works without a GPU: a dry run on the CPU writes its one JSON file and says so."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
                                              "no_memory", "no_nvtx", "defaults_teardown_cupti"}
        assert result[part]["rounds"] == 1
    assert "DRY RUN" in done.stdout


def _gpu_check() -> Any:
    """The benchmark module, imported with ``sys.path`` put back as it was (it adds ``benchmarks/`` itself)."""
    path = list(sys.path)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path[:] = path
    return gpu_check


def test_rounds_stop_before_the_one_that_would_overrun_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run takes 1 s of a manual clock, 8 runs a round: with 20 s left after the first round, the second
    (ending at 16 s) runs and the third (24 s) is not begun. The first round always runs."""
    gpu_check = _gpu_check()
    now = [0.0]

    def measure(settings: Any) -> float:
        now[0] += 1.0
        return 2.0 if settings is None else 2.5

    result = gpu_check.alternate(measure, rounds=5, deadline=20.0, clock=lambda: now[0])
    assert result["rounds"] == 2 and now[0] == 16.0
    assert result["ratio"]["defaults"] == 1.25 and result["added_us_per_step"]["no_window"] == 500.0
    assert gpu_check.alternate(measure, rounds=5, deadline=-1.0, clock=lambda: now[0])["rounds"] == 1


def test_a_variant_runs_under_its_environment_and_puts_back_what_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_check = _gpu_check()
    seen = []
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    gpu_check.measure_variant(lambda settings: seen.append(os.environ.get("TEARDOWN_CUPTI")) or 1.0,
                              "defaults_teardown_cupti")
    gpu_check.measure_variant(lambda settings: seen.append(os.environ.get("TEARDOWN_CUPTI")) or 1.0, "defaults")
    assert seen == ["1", "0"] and os.environ["TEARDOWN_CUPTI"] == "0"
    monkeypatch.delenv("TEARDOWN_CUPTI")
    gpu_check.measure_variant(lambda settings: 1.0, "defaults_teardown_cupti")
    assert "TEARDOWN_CUPTI" not in os.environ
