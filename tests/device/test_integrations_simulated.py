"""The three integrations end to end on the simulated GPU: a real Lightning fit, a real HF Trainer and a real
accelerate loop, each on a tiny real model of CPU tensors, with perfhooks bound to ``cuda:0`` so that its events,
memory figures and OOM path run on the simulation. The model's kernels and activations are simulated: a hook on
its first layer queues a forward kernel and holds an activation, a backward hook queues the backward's kernel.

Each run keeps its framework's defaults (a logger, checkpoints, validation or evaluation where it has them).
No profiler window opens (``schedule=None``): a window on a CUDA device asks torch.profiler for CUPTI's CUDA
activity, which this CPU build cannot give (there, torch's profiler makes every operator ~100 times slower); the
window path is tested on the CPU and, with a GPU, in ``tests/test_cuda.py``. One test opens a 2-step window, for
what a window on the device does to the environment (``TEARDOWN_CUPTI``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from simulated_gpu import SimulatedGpu, simulated_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
# imported before the simulation is installed, as on a CPU build (their annotations read torch.cuda at import)
from transformers import Trainer, TrainingArguments

from hf_trainer_example import SyntheticTokens, tiny_gpt2
from perfhooks.runtime.engine import Engine

MIB = 2**20
FORWARD_MS, BACKWARD_MS, ACTIVATION = 4.0, 6.0, 64 * MIB
NO_WINDOW: dict[str, Any] = {"console": False, "schedule": None, "on_demand": False, "memory_poll_s": 0.0}


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch):
    """perfhooks' engine bound to ``cuda:0`` whatever device the framework reports (the tensors stay on the CPU:
    this is a CPU build); the simulated GPU installed for the test."""
    start = Engine.start.__func__  # type: ignore[attr-defined]

    def on_device(cls: type, *args: Any, **kwargs: Any) -> Any:
        kwargs["device"] = "cuda:0"
        return start(cls, *args, **kwargs)

    monkeypatch.setattr(Engine, "start", classmethod(on_device))
    with simulated_cuda(memory_bytes=1 << 30) as gpu:
        yield gpu


class SimulatedWork:
    """Hooks on a model's first layer: each forward queues a kernel and holds an activation until the next
    forward; each backward queues a kernel. ``oom_at``: the forward (count from 0) that asks for the whole
    device."""

    def __init__(self, gpu: SimulatedGpu, layer: torch.nn.Module, oom_at: int | None = None) -> None:
        self.gpu, self.oom_at, self.forwards = gpu, oom_at, 0
        self.held: list[int] = []
        layer.register_forward_hook(self.forward)
        layer.register_full_backward_hook(self.backward)

    def forward(self, *args: Any) -> None:
        if not torch.is_grad_enabled():  # validation, evaluation
            return
        for handle in self.held:
            self.gpu.free(handle)
        self.held.clear()
        if self.oom_at is not None and self.forwards == self.oom_at:
            self.gpu.alloc(2 << 30)  # raises torch.OutOfMemoryError, as a real allocation would
        self.forwards += 1
        self.gpu.run(FORWARD_MS)
        self.held.append(self.gpu.alloc(ACTIVATION))

    def backward(self, *args: Any) -> None:
        self.gpu.run(BACKWARD_MS)


def _check_timed_on_the_device(report: dict[str, Any], gpu: SimulatedGpu, steps: int) -> None:
    assert report["device"]["type"] == "cuda" and report["device"]["name"] == "Simulated GPU 0"
    assert report["steps"] == steps and report["faults"] == [], report["faults"]
    assert report["phases"]["forward"]["p50_ms"] >= FORWARD_MS
    assert report["phases"]["backward"]["p50_ms"] >= BACKWARD_MS
    assert gpu.events_recorded[0] > 0 and gpu.syncs == [], "no host sync: events are polled, never waited on"
    assert report["memory"]["peak_used_bytes"] >= ACTIVATION


def test_lightning_fit_on_the_simulated_gpu(tmp_path: Path, on_cuda: SimulatedGpu) -> None:
    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    model = lightning_mlp()
    SimulatedWork(on_cuda, model.net[0])
    trainer = default_trainer(tmp_path, max_steps=12, callbacks=[PerfCallback(output_dir=tmp_path / "perf",
                                                                              **NO_WINDOW)])
    trainer.fit(model, random_loader(12), random_loader(2))
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    _check_timed_on_the_device(report, on_cuda, 12)
    assert list((tmp_path / "lightning_logs").rglob("*.ckpt")), "the default checkpoint was written"


def test_lightning_oom_on_the_simulated_gpu_is_dumped_and_raised(tmp_path: Path, on_cuda: SimulatedGpu) -> None:
    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    model = lightning_mlp()
    SimulatedWork(on_cuda, model.net[0], oom_at=5)
    # a sudden 2 GiB request gives no approach to arm the history on: record it from the start
    trainer = default_trainer(tmp_path, max_steps=12, callbacks=[PerfCallback(output_dir=tmp_path / "perf",
                                                                              memory_history=True, **NO_WINDOW)])
    with pytest.raises(torch.OutOfMemoryError, match=r"CUDA out of memory\. Tried to allocate 2\.00 GiB"):
        trainer.fit(model, random_loader(12), random_loader(2))
    oom = tmp_path / "perf" / "oom"
    summary = json.loads((oom / "summary.json").read_text())
    assert summary["step"] == 5 and summary["phase"] == "forward" and summary["requested_bytes"] == 2 << 30
    assert (oom / "snapshot.pickle").exists() and (oom / "observer.json").exists(), summary["files"]
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    assert report["status"] == "failed" and report["error"]["type"] == "OutOfMemoryError"


def test_hf_trainer_on_the_simulated_gpu(tmp_path: Path, on_cuda: SimulatedGpu) -> None:
    from perfhooks.integrations.transformers import PerfTrainerCallback

    model = tiny_gpt2(vocab=128, seq_len=16)
    SimulatedWork(on_cuda, model.transformer.h[0])
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=12, per_device_train_batch_size=4,
                             use_cpu=True, logging_steps=5, eval_strategy="steps", eval_steps=6,
                             save_strategy="steps", save_steps=6, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=SyntheticTokens(48, seq_len=16, vocab=128),
                      eval_dataset=SyntheticTokens(8, seq_len=16, vocab=128),
                      callbacks=[PerfTrainerCallback(output_dir=str(tmp_path / "perf"), **NO_WINDOW)])
    trainer.train()
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    _check_timed_on_the_device(report, on_cuda, 12)
    assert sorted(p.name for p in (tmp_path / "hf").glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-6"]


def test_accelerate_loop_on_the_simulated_gpu(tmp_path: Path, on_cuda: SimulatedGpu) -> None:
    from accelerate import Accelerator

    from helpers import mlp, random_loader
    from perfhooks.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True)
    model = mlp()
    SimulatedWork(on_cuda, model[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, data = accelerator.prepare(model, optimizer, random_loader(12))
    with attach(accelerator, model, optimizer, data, output_dir=str(tmp_path / "perf"), **NO_WINDOW) as perf:
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    _check_timed_on_the_device(perf.engine.report(), on_cuda, 12)


def test_lightning_fit_with_a_window_lets_cupti_go_and_puts_the_environment_back(
        tmp_path: Path, on_cuda: SimulatedGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's defaults (logger, checkpoints, validation) and perfhooks' own window on the device: from the
    step that opens the window to the fit's end, ``TEARDOWN_CUPTI=1`` (Kineto reads it when the window stops);
    after the fit, the environment is as it was. torch's CUDA version reads 12.8 (teardown safe)."""
    import lightning as L

    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks import Schedule
    from perfhooks.integrations.lightning import PerfCallback

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    seen: list[str | None] = []

    class Environment(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            seen.append(os.environ.get("TEARDOWN_CUPTI"))

    model = lightning_mlp()
    SimulatedWork(on_cuda, model.net[0])
    settings = {**NO_WINDOW, "schedule": Schedule(skip_first=2, warmup=0, active=2), "analyze_windows": False}
    trainer = default_trainer(tmp_path, max_steps=6, callbacks=[Environment(), PerfCallback(
        output_dir=tmp_path / "perf", **settings)])
    trainer.fit(model, random_loader(6), random_loader(2))
    assert seen[:2] == [None, None] and set(seen[3:]) == {"1"}, seen
    assert "TEARDOWN_CUPTI" not in os.environ
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    assert len(report["windows"]) == 1 and report["faults"] == [], report["faults"]
