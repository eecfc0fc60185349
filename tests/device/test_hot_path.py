"""How much of perfhooks' own Python a steady step runs, counted on the simulated GPU: its function calls a step.

On a host-bound GPU step every microsecond perfhooks spends on the training thread is added to the step, and a
Python call costs about a microsecond there (more on a slow host). ``benchmarks/sim_step_cost.py`` times it; these
tests count it, which holds on any machine, idle or loaded: perfhooks' function calls (frames whose code is in the
``perfhooks`` package) a steady step, for a plain loop and a Lightning fit with its defaults. The bounds sit a few
calls above what the code makes now, so a step that grows by a part's worth of calls fails here first.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from simulated_gpu import SimulatedGpu

import perfhooks
import perfhooks.integrations

#: The most perfhooks function calls a steady plain-loop step may make (52 at the time of writing: six phase
#: boundaries, each through torch's hook, the tracker and one device mark, and the step's end and open).
MAX_PLAIN_LOOP_CALLS = 60
#: The same for a Lightning fit with its defaults (81: Lightning reports about 48 profiler actions a step, 24 of
#: them callback hooks, timed in the first 32 steps and then one step in 16; 183 when every step timed them).
MAX_LIGHTNING_CALLS = 90
WARM_STEPS, MEASURED_STEPS = 30, 40
#: The memory monitor samples on time (``memory_poll_s``), not per step: on a loaded machine whose steps take tens
#: of ms, every step would sample and the count would follow the machine's speed (90.7 against 90 once, with both
#: cores busy). A poll longer than the run leaves only its first sample, so the count is the steps' own.
SETTINGS: dict[str, Any] = {"console": False, "schedule": None, "on_demand": False, "memory_poll_s": 3600.0}
#: Where perfhooks' code is: the engine and its integrations (installed as ``perfhooks.integrations``).
PACKAGES = (str(Path(perfhooks.__file__).parent), str(Path(perfhooks.integrations.__file__).parent))


class CallCount:
    """perfhooks' function calls on this thread while counting (``sys.setprofile``), by function."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGES):
            key = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
            self.calls[key] = self.calls.get(key, 0) + 1

    def __enter__(self) -> CallCount:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *_exc: object) -> None:
        sys.setprofile(None)

    def per_step(self) -> float:
        return sum(self.calls.values()) / MEASURED_STEPS

    def largest(self) -> list[tuple[str, float]]:
        return sorted(((key, count / MEASURED_STEPS) for key, count in self.calls.items()), key=lambda kv: -kv[1])


def plain_loop(gpu: SimulatedGpu, tmp_path: Path, step_hook: Callable[[int], None]) -> dict[str, Any]:
    from helpers import mlp

    torch.random.default_generator.manual_seed(0)
    model = mlp()
    model[0].register_forward_hook(lambda *args: gpu.run(0.05) if torch.is_grad_enabled() else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randn(8, 32), torch.randn(8, 1)) for _ in range(4)]
    perf = perfhooks.profile(model, optimizer, output_dir=tmp_path / "perf", **SETTINGS)
    for step in range(WARM_STEPS + MEASURED_STEPS + 1):
        step_hook(step)
        with perf.data_wait():
            x, y = batches[step % 4]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return perf.close()


def test_a_steady_plain_loop_step_makes_few_perfhooks_calls(on_cuda: SimulatedGpu, tmp_path: Path) -> None:
    counting = CallCount()

    def at(step: int) -> None:
        if step == WARM_STEPS - 1:
            time.sleep(0.05)  # the timing reader's reads return the warm steps' events to the pool
        elif step == WARM_STEPS:
            counting.__enter__()
        elif step == WARM_STEPS + MEASURED_STEPS:
            counting.__exit__()

    report = plain_loop(on_cuda, tmp_path, at)
    assert report["steps"] == WARM_STEPS + MEASURED_STEPS + 1 and report["faults"] == []
    assert report["device"]["type"] == "cuda" and report["phases"]["forward"]["p50_ms"] >= 0.05, "device-timed"
    per_step = counting.per_step()
    assert per_step <= MAX_PLAIN_LOOP_CALLS, f"{per_step:.1f} calls a step; the most: {counting.largest()[:12]}"


def test_a_steady_lightning_step_makes_few_perfhooks_calls(on_cuda: SimulatedGpu, tmp_path: Path) -> None:
    """Lightning's defaults on (logger, checkpoint, progress bar, validation): its callback hooks, about 24 a
    step, are timed in the first steps and then one step in 16; the fetch, optimizer and zero_grad are followed."""
    import lightning as L

    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    counting = CallCount()

    class Counting(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == WARM_STEPS - 1:
                time.sleep(0.05)  # the timing reader's reads return the warm steps' events to the pool
            elif trainer.global_step == WARM_STEPS:
                counting.__enter__()
            elif trainer.global_step == WARM_STEPS + MEASURED_STEPS:
                counting.__exit__()

    torch.random.default_generator.manual_seed(0)
    model = lightning_mlp()
    model.net[0].register_forward_hook(lambda *args: on_cuda.run(0.05) if torch.is_grad_enabled() else None)
    steps = WARM_STEPS + MEASURED_STEPS + 1
    trainer = default_trainer(tmp_path, max_steps=steps, enable_progress_bar=True,
                              callbacks=[Counting(), PerfCallback(output_dir=tmp_path / "perf", **SETTINGS)])
    trainer.fit(model, random_loader(steps), random_loader(2))
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    assert report["steps"] == steps and report["faults"] == [] and report["device"]["type"] == "cuda"
    per_step = counting.per_step()
    assert per_step <= MAX_LIGHTNING_CALLS, f"{per_step:.1f} calls a step; the most: {counting.largest()[:12]}"
