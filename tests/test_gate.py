"""Issue 42, part 1: ``perfhooks diff BEFORE AFTER --gate PCT`` on real plain-loop runs, and its statistics on exact
figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import perfhooks
from perfhooks.cli import main


def run(folder: Path, step_s: float, batch: int = 8, steps: int = 60) -> Path:
    """A plain loop of ``steps`` steps, each holding the host ``step_s`` (the work a slower commit adds)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfhooks.profile(model, optimizer, output_dir=folder, console=False, wandb=False, schedule=None) as perf:
        for _ in range(steps):
            with perf.data_wait():
                x = torch.randn(batch, 16)
            model(x).pow(2).mean().backward()
            time.sleep(step_s)
            optimizer.step()
            optimizer.zero_grad()
    return folder


def diff(before: Path, after: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    status = main(["diff", str(before), str(after), "--gate", "5", "--format", "json", *extra])
    return status, json.loads(capsys.readouterr().out)


def test_the_gate_on_three_plain_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path / "base", 0.020)
    slower = run(tmp_path / "slower", 0.028)  # 8 ms slower a step
    rerun = run(tmp_path / "rerun", 0.020)
    other_batch = run(tmp_path / "batch16", 0.020, batch=16)

    status, result = diff(base, slower, capsys)
    assert (status, result["verdict"]) == (1, "regressed")
    step = result["gate"]["step_ms"]
    assert step["after_interval"][0] > step["before_interval"][1] and step["change"] > 0.05

    status, result = diff(base, rerun, capsys)
    assert (status, result["verdict"]) == (0, "unchanged")

    status, result = diff(base, other_batch, capsys)
    assert (status, result["verdict"]) == (2, "not_comparable")
    assert result["gate"]["reasons"] == ["samples per step: 8.0 before, 16.0 after"]
    status, result = diff(base, other_batch, capsys, "--force")
    assert status in (0, 1) and result["gate"]["forced"]

    status = main(["diff", str(base), str(slower), "--gate", "5"])
    text = capsys.readouterr().out
    assert status == 1 and "gate 5%: regressed" in text and "95% bootstrap intervals" in text


def test_the_interval_and_the_verdicts_on_exact_figures() -> None:
    from perfhooks.offline.gate import format_gate, gate, lower_quartile, median_interval

    def report(steps: list[float], **throughput: float) -> dict:
        return {"framework": "plain", "device": {"type": "cpu", "name": "cpu"}, "world_size": 1,
                "throughput": {"samples_per_step": 8, "matmul_dtype": "fp32", **throughput}, "diagnoses": [],
                "series": {"data_wait": [0.0] * len(steps), "forward": steps, "backward": [0.0] * len(steps),
                           "optimizer": [0.0] * len(steps), "other": [0.0] * len(steps),
                           "perfhooks": [0] * len(steps)}}

    median, low, high = median_interval([10.0] * 20 + [11.0] * 20)
    assert median == 10.5 and low == 10.0 and high == 11.0
    assert lower_quartile([10.0, 11.0, 12.0, 13.0, 14.0]) == 11.0
    # bursts from another process: a quarter of the steps caught before, half after; the code did not change
    bursts = gate(report([10.0] * 45 + [20.0] * 15), report([10.0, 20.0] * 30), 5)
    assert bursts["verdict"] == "unchanged" and bursts["step_ms"]["median"] == [10.0, 20.0]  # the median: +100%
    slower = gate(report([10.0] * 45 + [20.0] * 15), report([11.0] * 45 + [21.0] * 15), 5)
    assert slower["verdict"] == "regressed" and slower["step_ms"]["change"] == pytest.approx(0.1)
    noisy = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0] * 10  # p25s of resamples spread over [10, 12]
    assert gate(report(noisy), report([ms * 1.06 for ms in noisy]), 5)["verdict"] == "unchanged"  # inside the noise
    assert gate(report([10.0] * 60), report([10.4] * 60), 5)["verdict"] == "unchanged"  # +4%, under the gate
    noisy_words = format_gate(gate(report(noisy), report([ms * 1.06 for ms in noisy]), 5)).splitlines()[0]
    assert noisy_words == "gate 5%: within noise (+6.0%, but the two runs' 95% intervals overlap)"
    assert format_gate(gate(report([10.0] * 60), report([10.4] * 60), 5)).splitlines()[0] == \
        "gate 5%: within noise (+4.0% is inside the 5% gate)"
    assert gate(report([10.0] * 60), report([11.0] * 60), 5)["verdict"] == "regressed"
    assert gate(report([11.0] * 60), report([10.0] * 60), 5)["verdict"] == "improved"
    short = gate(report([10.0] * 8), report([20.0] * 8), 5)
    assert short["verdict"] == "unchanged" and "fewer than 10" in short["step_ms"]["missing"]


def test_a_bad_gate_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path), str(tmp_path), "--gate", "-1"]) == 2
    assert "--gate must be a percentage >= 0" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the same on Lightning and HF
def side_by_side(tmp_path: Path, framework: str, runs: dict[str, tuple[float, int]]) -> dict[str, Path]:
    """The runs, each in a process of its own, all at once: whatever else the machine does then (the other test
    worker), it does to every run alike, as the gate assumes of two runs on one CI runner type. A barrier starts
    their first steps together and keeps each run's load until the last has ended (``gate_run.py``)."""
    script = Path(__file__).parent / "scripts" / "gate_run.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    processes = {name: subprocess.Popen([sys.executable, str(script), framework, str(tmp_path / name), str(step_s),
                                         str(batch), str(barrier), str(len(runs))], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env)
                 for name, (step_s, batch) in runs.items()}
    folders = {}
    for name, process in processes.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        folders[name] = Path(out.strip().splitlines()[-1])
    return folders


@pytest.mark.slow
@pytest.mark.parametrize("framework,batch", [("lightning", 8), ("transformers", 2)])
def test_the_gate_on_framework_runs(framework: str, batch: int, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Three 150-step runs against a base, gated at 10%: 20 ms slower a step, about +40% (exit 1), a rerun
    (exit 0), another batch size (exit 2). With both cores busy the rerun read -4..+1% from the base in 5 tries,
    and the slower run +36..+42% (``.ci/busy_suite.py``'s load, 2026-11-27)."""
    runs = side_by_side(tmp_path, framework, {"base": (0.040, batch), "slower": (0.060, batch),
                                              "rerun": (0.040, batch), "batch": (0.040, batch * 2)})
    status, result = diff(runs["base"], runs["slower"], capsys, "--gate", "10")
    assert (status, result["verdict"]) == (1, "regressed"), result["gate"]["step_ms"]
    status, result = diff(runs["base"], runs["rerun"], capsys, "--gate", "10")
    assert (status, result["verdict"]) == (0, "unchanged"), result["gate"]["step_ms"]
    status, result = diff(runs["base"], runs["batch"], capsys)
    assert (status, result["verdict"]) == (2, "not_comparable")
    assert result["gate"]["reasons"][0].startswith("samples per step:")
