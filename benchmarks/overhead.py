"""Overhead of perfhooks on the training loop: the example with and without PerfCallback.

    python benchmarks/overhead.py [--quick] [--pairs N] [--steps N]

Prints, with the machine named:
- the step-time ratio with the callback (schedule=None: outside windows) to without, per
  interleaved A/B pair, as median and min-max (target: at most 1.01);
- the host cost of the engine per step in µs: the 7 events a Lightning step sends, timed in a
  tight loop with no training work (target: at most 20 µs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))


def machine() -> str:
    from perfhooks.device import _cpu_model

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{_cpu_model()}, {os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


def step_times_ms(with_perf: bool, steps: int, d_model: int, batch_size: int, seq_len: int,
                  **settings: object) -> list[float]:
    """Per-step wall time of a Lightning fit of the example, from batch end to batch end."""
    import lightning as L

    from perfhooks.integrations.lightning import PerfCallback
    from tutorial_transformer import lightning_module, make_dataloader

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, *args) -> None:
            self.ends.append(time.perf_counter())

    timer = StepTimer()
    callbacks: list = [timer]
    with tempfile.TemporaryDirectory() as out:
        if with_perf:
            callbacks.insert(0, PerfCallback(output_dir=out, schedule=None, console=False, **settings))
        torch.manual_seed(0)
        trainer = L.Trainer(max_steps=steps, accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
                            enable_model_summary=False, enable_progress_bar=False, callbacks=callbacks)
        model = lightning_module(d_model, max(1, d_model // 64))
        trainer.fit(model, make_dataloader(steps, batch_size, seq_len, d_model))
    ends = timer.ends
    return [(ends[i + 1] - ends[i]) * 1e3 for i in range(2, len(ends) - 1)]  # the first steps warm up


def host_cost_us(steps: int = 20_000, repeats: int = 5) -> float:
    """µs per step for the engine's events alone (no training work), median of ``repeats``."""
    from perfhooks import Engine, PerfConfig

    results = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(repeats):
            engine = Engine(PerfConfig(schedule=None, console=False), out, "benchmark")
            start = time.perf_counter_ns()
            for _ in range(steps):
                engine.phase_start("data_wait")
                engine.phase_start("forward")
                engine.phase_start("backward")
                engine.phase_end("backward")
                engine.phase_start("optimizer")
                engine.phase_end("optimizer")
                engine.step_end()
            results.append((time.perf_counter_ns() - start) / steps / 1e3)
            engine.close()
    return statistics.median(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller model, fewer steps (d_model 256, 12 steps)")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved A/B pairs (at least 5)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run")
    args = parser.parse_args(argv)
    if args.pairs < 5:
        parser.error("--pairs must be at least 5")
    d_model = 256 if args.quick else 512
    steps = args.steps or (12 if args.quick else 20)

    print(f"machine: {machine()}")
    print(f"example: tutorial transformer layer, d_model {d_model}, batch 16 x 128, {steps} steps per run")
    step_times_ms(False, 4, d_model, 16, 128)  # warm-up: imports, allocator, thread pools
    ratios: list[float] = []
    all_base: list[float] = []
    all_perf: list[float] = []
    for pair in range(args.pairs):
        base_steps = step_times_ms(False, steps, d_model, 16, 128)
        perf_steps = step_times_ms(True, steps, d_model, 16, 128)
        base, perf = statistics.median(base_steps), statistics.median(perf_steps)
        all_base += base_steps
        all_perf += perf_steps
        ratios.append(perf / base)
        print(f"  pair {pair + 1}: without {base:8.2f} ms  with {perf:8.2f} ms  ratio {perf / base:.4f}")
    pooled = statistics.median(all_perf) / statistics.median(all_base)
    print(f"step-time ratio with/without PerfCallback (outside windows): median of pairs "
          f"{statistics.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f}) over {args.pairs} A/B "
          f"pairs; pooled median step {statistics.median(all_perf):.2f} / {statistics.median(all_base):.2f} ms "
          f"= {pooled:.4f}; target <= 1.01")
    cost = host_cost_us()
    print(f"engine host cost per step: {cost:.2f} µs (7 events, no NVTX tool attached); target <= 20 µs")
    memory_history_overhead(args.pairs, steps, d_model)
    return 0


def memory_history_overhead(pairs: int, steps: int, d_model: int) -> None:
    """CUDA only: step time with torch.cuda.memory._record_memory_history on, over off (interleaved pairs)."""
    if not torch.cuda.is_available():
        print("memory history overhead: needs CUDA (history records CUDA allocations only); not measured here")
        return
    ratios = []
    for _ in range(pairs):
        off = statistics.median(step_times_ms(True, steps, d_model, 16, 128, memory_history=False))
        on = statistics.median(step_times_ms(True, steps, d_model, 16, 128, memory_history=True))
        torch.cuda.memory._record_memory_history(enabled=None)
        ratios.append(on / off)
    print(f"memory history on / off (max_entries 100000): median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}) over {pairs} pairs")


if __name__ == "__main__":
    raise SystemExit(main())
