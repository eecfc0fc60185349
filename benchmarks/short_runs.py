"""perfhooks' own cost on short and fast runs (issue 26, items 16 and 17).

    python benchmarks/short_runs.py [--rounds 5]

1. **Close cost**: a 20-step fit of Lightning's ``BoringModel`` (Lightning's defaults on), plain and with
   ``PerfCallback()`` and its default schedule (one capture window), interleaved round by round; the wall time
   of ``trainer.fit`` and the time perfhooks adds (median of the rounds). Target: under 0.15 s added, window
   included.
2. **Overlap**: a 200-step hand-written loop of about 15 ms a step under the default schedule; the share of steps
   that overlapped perfhooks' own work (a window, its export, its analysis), from the report. Target: at most
   10% of steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import describe_machine  # noqa: E402

CLOSE_TARGET_S = 0.15
OVERLAP_TARGET = 0.10


def boring_fit_s(with_perfhooks: bool, root: Path) -> float:
    """Wall time (s) of ``trainer.fit`` on Lightning's BoringModel for 20 steps, defaults on."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    from perfhooks.integrations.lightning import PerfCallback

    callbacks = [PerfCallback(console=False)] if with_perfhooks else []
    trainer = L.Trainer(max_steps=20, accelerator="cpu", devices=1, default_root_dir=str(root), callbacks=callbacks,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=2)
    model = BoringModel()
    start = time.perf_counter()
    trainer.fit(model)
    return time.perf_counter() - start


def close_cost(rounds: int) -> dict[str, float]:
    plain, perf = [], []
    with tempfile.TemporaryDirectory() as folder:
        boring_fit_s(False, Path(folder) / "warm")  # imports, first calls
        boring_fit_s(True, Path(folder) / "warm_perf")
        for index in range(rounds):
            order = (False, True) if index % 2 == 0 else (True, False)
            for with_perfhooks in order:
                took = boring_fit_s(with_perfhooks, Path(folder) / f"{index}_{with_perfhooks}")
                (perf if with_perfhooks else plain).append(took)
    added = [p - q for p, q in zip(perf, plain, strict=True)]
    return {"plain_s": statistics.median(plain), "perfhooks_s": statistics.median(perf),
            "added_s": statistics.median(added), "added_max_s": max(added)}


def overlap_share(steps: int = 200, step_ms: float = 15.0) -> dict[str, float]:
    """The default schedule over a plain loop of ``steps`` steps of about ``step_ms`` each."""
    import perfhooks

    torch.manual_seed(0)
    width = 192
    model = torch.nn.Sequential(torch.nn.Linear(width, width * 4), torch.nn.ReLU(), torch.nn.Linear(width * 4, width))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(256, width)
    def train_step(repeats: int) -> None:
        loss = sum(model(batch).square().mean() for _ in range(repeats))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    repeats = 1
    for _ in range(3):  # size the step to about step_ms on this machine (warm-up included)
        start = time.perf_counter()
        for _ in range(5):
            train_step(repeats)
        took_ms = (time.perf_counter() - start) / 5 * 1e3
        repeats = max(1, round(repeats * step_ms / took_ms))
    with tempfile.TemporaryDirectory() as folder:
        engine = perfhooks.Engine(perfhooks.PerfConfig(console=False), folder, framework="plain")
        for _ in range(steps):
            engine.phase_start("data_wait")
            engine.phase_start("forward")
            loss = sum(model(batch).square().mean() for _ in range(repeats))
            engine.phase_start("backward")
            loss.backward()
            engine.phase_start("optimizer")
            optimizer.step()
            optimizer.zero_grad()
            engine.stepped()
            engine.step_end()
        report = engine.close()
    assert report is not None
    own = report["steady"]["perfhooks_steps"]
    return {"steps": report["steps"], "own_steps": own, "share": own / report["steps"],
            "step_ms": report["step_ms"]["p50"], "windows": len(report["windows"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the close-cost fit (default 5)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(describe_machine())
    cost = close_cost(args.rounds)
    print(f"close cost: BoringModel 20 steps, fit {cost['plain_s']:.3f} s plain, {cost['perfhooks_s']:.3f} s with "
          f"PerfCallback() (median of {args.rounds}); added {cost['added_s']:.3f} s (max {cost['added_max_s']:.3f}); "
          f"target < {CLOSE_TARGET_S} s: {'met' if cost['added_s'] < CLOSE_TARGET_S else 'NOT met'}")
    overlap = overlap_share()
    print(f"overlap: {overlap['steps']} steps of {overlap['step_ms']:.1f} ms (p50), {overlap['windows']} window(s); "
          f"{overlap['own_steps']} overlapped perfhooks' own work = {overlap['share']:.1%}; target <= "
          f"{OVERLAP_TARGET:.0%}: {'met' if overlap['share'] <= OVERLAP_TARGET else 'NOT met'}")
    print(json.dumps({"close": cost, "overlap": overlap}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
