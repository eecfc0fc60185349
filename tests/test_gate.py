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
    from perfhooks.offline.gate import gate, lower_quartile, median_interval

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
    assert gate(report([10.0] * 60), report([11.0] * 60), 5)["verdict"] == "regressed"
    assert gate(report([11.0] * 60), report([10.0] * 60), 5)["verdict"] == "improved"
    short = gate(report([10.0] * 8), report([20.0] * 8), 5)
    assert short["verdict"] == "unchanged" and "fewer than 10" in short["step_ms"]["missing"]


def test_a_bad_gate_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path), str(tmp_path), "--gate", "-1"]) == 2
    assert "--gate must be a percentage >= 0" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the same on Lightning and HF
def lightning_fit(root: Path, step_s: float, batch: int = 8, steps: int = 60) -> Path:
    """A Lightning fit with its defaults on (logger, checkpoint, progress bar, summary); each training step holds
    the host ``step_s`` longer (the work a slower commit adds)."""
    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    torch.manual_seed(0)
    module = lightning_mlp()
    step = module.training_step

    def slower_step(batch_: object, batch_idx: int) -> torch.Tensor:
        time.sleep(step_s)
        return step(batch_, batch_idx)

    module.training_step = slower_step  # type: ignore[method-assign]
    trainer = default_trainer(root, max_steps=steps, limit_val_batches=2,
                              callbacks=[PerfCallback(console=False, wandb=False, schedule=None)])
    trainer.fit(module, random_loader(steps, batch_size=batch), random_loader(2, batch_size=batch))
    return root / "lightning_logs" / "version_0" / "perfhooks"


def hf_run(root: Path, step_s: float, batch: int = 2, steps: int = 60) -> Path:
    """A real HF Trainer (transformers' defaults for logging, tqdm and ``report_to``) on a GPT-2 small enough that
    the step is mostly the host ``step_s`` its forward holds, so that a rerun's CPU drift stays under the gate."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from hf_trainer_example import SyntheticTokens
    from perfhooks.integrations.transformers import PerfTrainerCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    model.register_forward_pre_hook(lambda *_: time.sleep(step_s))
    args = TrainingArguments(output_dir=str(root), max_steps=steps, per_device_train_batch_size=batch,
                             save_strategy="no", use_cpu=True, logging_steps=10)
    Trainer(model=model, args=args, train_dataset=SyntheticTokens(steps * batch, seq_len=16, vocab=128),
            callbacks=[PerfTrainerCallback(console=False, schedule=None)]).train()
    return root / "_perfhooks"


@pytest.mark.slow
@pytest.mark.parametrize("make", [lightning_fit, hf_run], ids=["lightning", "transformers"])
def test_the_gate_on_framework_runs(make: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = make(tmp_path / "base", 0.040)  # type: ignore[operator]
    slower = make(tmp_path / "slower", 0.048)  # type: ignore[operator]
    rerun = make(tmp_path / "rerun", 0.040)  # type: ignore[operator]
    other_batch = make(tmp_path / "batch", 0.040, batch=4 if make is hf_run else 16)  # type: ignore[operator]
    capsys.readouterr()  # what the framework printed (Lightning's model summary)
    assert diff(base, slower, capsys)[1]["verdict"] == "regressed"
    assert diff(base, slower, capsys)[0] == 1
    assert diff(base, rerun, capsys)[:1] == (0,)
    status, result = diff(base, other_batch, capsys)
    assert (status, result["verdict"]) == (2, "not_comparable")
    assert result["gate"]["reasons"][0].startswith("samples per step:")
