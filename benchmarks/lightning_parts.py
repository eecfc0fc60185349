"""What each part of perfhooks costs a host-bound Lightning fit, on the simulated GPU with every device call charged.

    python benchmarks/lightning_parts.py [--steps 2000] [--rounds 5]

Issue 49 asks where the 135M GPT's 5% under ``PerfCallback()`` goes (H100 and H200; a host-bound step, 33-38 ms,
of which about 24 ms of kernels). On this CPU the same kind of step is a Lightning fit whose host time is the step:
a small MLP with its defaults on (logger, checkpoint, progress bar, validation), perfhooks bound to ``cuda:0`` of
the simulation (``tests/simulated_gpu.py``: an event record 2.5 µs, a query 1 µs, ...; the model's tensors stay on
the CPU). Each variant is a fresh fit; variants alternate round after round, each round in the reverse order of
the last. Per variant: the median steady step (wall clock, batch to batch, past the first 50 steps) and the mean
over the whole fit, less the bare fit's, in µs a step; the medians over rounds, with their range. Variants:
an empty callback (what Lightning's dispatch costs any callback: it calls each of about 24 hooks a step through
``trainer.profiler.profile``), perfhooks with its defaults but no window, then each part off in turn (the memory
monitor, the callback timing, the live view's console, the on-demand trigger, NVTX), then everything off but the
phases. The default window,
its FLOP-count step and its analysis are left to a GPU: on this CPU build a window asks torch's profiler for CUDA
activity it cannot record, and each window took about 15 s, nothing like its cost on a GPU
(``benchmarks/gpu_check.sh`` measures the 135M GPT, each part off in turn).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import (  # noqa: E402
    bind_to_the_simulation,
    describe_machine,
    one_torch_thread,
)
from simulated_gpu import SimulatedGpu, simulated_cuda  # noqa: E402

#: Each variant: the PerfCallback settings (None: the bare fit), and whether callback hooks are timed.
NO_WINDOW: dict[str, Any] = {"schedule": None}
VARIANTS: dict[str, tuple[dict[str, Any] | None, bool]] = {
    "bare": (None, False),
    "an empty callback": ({}, False),
    "perfhooks, no window": (NO_WINDOW, True),
    "no memory monitor": ({**NO_WINDOW, "memory": False}, True),
    "no callback timing": (NO_WINDOW, False),
    "no console": ({**NO_WINDOW, "console": False}, True),
    "no on-demand trigger": ({**NO_WINDOW, "on_demand": False}, True),
    "no NVTX": ({**NO_WINDOW, "nvtx": False}, True),
    "phases only": ({**NO_WINDOW, "count_flops": False, "analyze_windows": False, "memory": False,
                     "console": False, "on_demand": False, "nvtx": False}, False),
}
SKIP_STEPS = 50


def fit(gpu: SimulatedGpu, variant: str, steps: int, out: str) -> tuple[float, float]:
    """(median steady step, mean step) in µs of one fit."""
    import lightning as L

    from helpers import lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    ends: list[int] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            ends.append(time.perf_counter_ns())

    torch.random.default_generator.manual_seed(0)
    model = lightning_mlp()
    model.net[0].register_forward_hook(lambda *args: gpu.run(0.05) if torch.is_grad_enabled() else None)
    settings, timed = VARIANTS[variant]
    callbacks: list[Any] = [Clock()]
    saved = PerfCallback._time_callbacks
    if variant == "an empty callback":  # what Lightning's dispatch costs any callback: ~24 hook calls a step
        callbacks.append(type("Empty", (L.Callback,), {})())
    elif settings is not None:
        callbacks.append(PerfCallback(output_dir=Path(out) / variant, **settings))
        if not timed:
            PerfCallback._time_callbacks = lambda self, trainer, engine: None  # type: ignore[method-assign]
    try:
        trainer = L.Trainer(accelerator="cpu", devices=1, default_root_dir=str(Path(out) / "fit"), max_steps=steps,
                            callbacks=callbacks, enable_progress_bar=True, limit_val_batches=2,
                            val_check_interval=steps // 3)
        trainer.fit(model, random_loader(steps), random_loader(2))
    finally:
        PerfCallback._time_callbacks = saved  # type: ignore[method-assign]
    gaps = [(b - a) / 1e3 for a, b in itertools.pairwise(ends)]
    return statistics.median(gaps[SKIP_STEPS:]), statistics.mean(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # a fit of 300 steps (0.2 s) timed perfhooks' first fraction of a second (its threads starting, the event pool
    # filling): +144 µs a step against +116 at 3000 steps (2026-11-28)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(describe_machine())
    bind_to_the_simulation()
    one_torch_thread()
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    names = list(VARIANTS)
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with simulated_cuda(memory_bytes=1 << 30) as gpu, tempfile.TemporaryDirectory() as out:
        fit(gpu, "perfhooks, no window", 60, out)  # warm-up: imports, first allocations
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                figures[name].append(fit(gpu, name, args.steps, out))
    bare = figures["bare"]
    print(f"bare fit: median step {statistics.median(f[0] for f in bare):.0f} µs, mean "
          f"{statistics.median(f[1] for f in bare):.0f} µs ({args.steps} steps, {args.rounds} rounds)")
    for name in names[1:]:
        median = [f[0] - b[0] for f, b in zip(figures[name], bare, strict=True)]
        mean = [f[1] - b[1] for f, b in zip(figures[name], bare, strict=True)]
        print(f"{name:>20}: median step +{statistics.median(median):6.1f} µs (rounds {min(median):.0f} to "
              f"{max(median):.0f}); mean step +{statistics.median(mean):6.1f} µs (rounds {min(mean):.0f} to "
              f"{max(mean):.0f})")


if __name__ == "__main__":
    main()
