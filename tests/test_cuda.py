"""The engine on CUDA: event timing and no host syncs in steady state, on the simulated GPU always and on a real one
where present (the ``gpu`` fixture); Lightning on a real GPU only."""

from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import train_steps
from perfhooks import Engine, PerfConfig

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize")


def test_cuda_event_timing_of_a_known_kernel(tmp_path: Path, gpu) -> None:
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "test", device="cuda")
    for _ in range(6):
        engine.phase_start("data_wait")
        engine.phase_start("forward")
        gpu.run(50.0)
        engine.phase_end("forward")
        engine.step_end()
    report = engine.close()
    assert report["device"]["type"] == "cuda"
    forward_ms = report["phases"]["forward"]["p50_ms"]
    if gpu.simulated:  # the kernel's 50 ms, plus whatever the host took between the mark and the launch
        assert forward_ms >= 50.0
    else:  # _sleep's cycles calibrated against a host timer around a sync
        assert forward_ms == pytest.approx(50.0, rel=0.05)


def test_no_host_sync_in_a_steady_state_step(tmp_path: Path, gpu) -> None:
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "test", device="cuda")
    if gpu.simulated:
        for _ in range(10):
            engine.fetch()
            engine.phase_start("forward")
            gpu.run(2.0)
            engine.phase_start("backward")
            gpu.run(2.0)
            engine.phase_start("optimizer")
            engine.stepped()
        assert gpu.syncs == [], "a step made a blocking wait on the device"
        engine.close()
        assert gpu.syncs == [] and engine.stats.steps == 10
        return
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 1, device="cuda")

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch), y)

    def syncs_of(steps: Any) -> list[str]:
        """The blocking syncs torch's profiler sees around 5 steps (its own start and stop make some: on an H100
        and an H200 the bare loop's span held one ``cudaDeviceSynchronize``, CUPTI's, where no step made one)."""
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            steps()
        return sorted(event.name for event in profiler.events() if event.name in SYNC_CALLS)

    def bare_steps() -> None:
        for _ in range(5):
            loss_of(x).backward()
            optimizer.step()
            optimizer.zero_grad()

    bare_steps()
    bare = syncs_of(bare_steps)
    train_steps(engine, loss_of, optimizer, [x] * 5)
    profiled = syncs_of(lambda: train_steps(engine, loss_of, optimizer, [x] * 5))
    engine.close()
    assert profiled == bare, "perfhooks' steps made a blocking sync the same loop bare does not"
    assert engine.stats.steps == 10


@pytest.mark.cuda
def test_lightning_on_cuda(tmp_path: Path) -> None:
    from helpers import lightning_mlp, quiet_trainer, random_loader, read_report
    from perfhooks.integrations.lightning import PerfCallback

    callback = PerfCallback(output_dir=tmp_path, console=False)
    quiet_trainer(accelerator="gpu", max_steps=16, callbacks=[callback]).fit(lightning_mlp(), random_loader(64))
    report = read_report(tmp_path)
    assert report["device"]["type"] == "cuda" and report["steps"] == 16
    assert len(report["windows"]) == 1
