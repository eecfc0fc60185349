"""Issue 42, part 1: ``perfhooks diff BEFORE AFTER --gate PCT`` on real plain-loop runs, and its statistics on exact
figures."""

from __future__ import annotations

import json
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
    from perfhooks.offline.gate import gate, median_interval

    def report(steps: list[float], **throughput: float) -> dict:
        return {"framework": "plain", "device": {"type": "cpu", "name": "cpu"}, "world_size": 1,
                "throughput": {"samples_per_step": 8, "matmul_dtype": "fp32", **throughput}, "diagnoses": [],
                "series": {"data_wait": [0.0] * len(steps), "forward": steps, "backward": [0.0] * len(steps),
                           "optimizer": [0.0] * len(steps), "other": [0.0] * len(steps),
                           "perfhooks": [0] * len(steps)}}

    median, low, high = median_interval([10.0] * 20 + [11.0] * 20)
    assert median == 10.5 and low == 10.0 and high == 11.0
    noisy = [10.0, 12.0] * 30  # medians of resamples spread over [10, 12]
    assert gate(report(noisy), report([11.6] * 60), 5)["verdict"] == "unchanged"  # +5.5%, inside the noise
    assert gate(report([10.0] * 60), report([10.4] * 60), 5)["verdict"] == "unchanged"  # +4%, under the gate
    assert gate(report([10.0] * 60), report([11.0] * 60), 5)["verdict"] == "regressed"
    assert gate(report([11.0] * 60), report([10.0] * 60), 5)["verdict"] == "improved"
    short = gate(report([10.0] * 8), report([20.0] * 8), 5)
    assert short["verdict"] == "unchanged" and "fewer than 10" in short["step_ms"]["missing"]


def test_a_bad_gate_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path), str(tmp_path), "--gate", "-1"]) == 2
    assert "--gate must be a percentage >= 0" in capsys.readouterr().err
