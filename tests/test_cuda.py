"""CUDA-only checks of the engine: event timing accuracy and no host syncs in steady state."""

import time
from pathlib import Path

import pytest
import torch

from helpers import train_steps
from perfhooks import Engine, PerfConfig

pytestmark = pytest.mark.cuda

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize")


def sleep_alone_ms(cycles: int, repeats: int = 5) -> float:
    """The length of ``torch.cuda._sleep(cycles)`` measured alone, host-side around a sync."""
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def test_cuda_event_timing_of_a_known_kernel(tmp_path: Path) -> None:
    cycles = 50_000_000
    expected_ms = sleep_alone_ms(cycles)
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "test", device="cuda")
    for _ in range(6):
        engine.phase_start("data_wait")
        engine.phase_start("forward")
        torch.cuda._sleep(cycles)
        engine.phase_end("forward")
        engine.step_end()
    report = engine.close()
    assert report["device"]["type"] == "cuda"
    assert report["phases"]["forward"]["p50_ms"] == pytest.approx(expected_ms, rel=0.05)


def test_no_host_sync_in_a_steady_state_step(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "test", device="cuda")
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 1, device="cuda")

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch), y)

    train_steps(engine, loss_of, optimizer, [x] * 5)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        train_steps(engine, loss_of, optimizer, [x] * 5)
    engine.close()
    syncs = [event.name for event in profiler.events() if event.name in SYNC_CALLS]
    assert syncs == []
    assert engine.stats.steps == 10


def test_lightning_on_cuda(tmp_path: Path) -> None:
    from helpers import lightning_mlp, quiet_trainer, random_loader, read_report
    from perfhooks.integrations.lightning import PerfCallback

    callback = PerfCallback(output_dir=tmp_path, console=False)
    quiet_trainer(accelerator="gpu", max_steps=16, callbacks=[callback]).fit(lightning_mlp(), random_loader(64))
    report = read_report(tmp_path)
    assert report["device"]["type"] == "cuda" and report["steps"] == 16
    assert len(report["windows"]) == 1
