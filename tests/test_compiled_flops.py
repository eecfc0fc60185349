"""A ``torch.compile``'d model gets the FLOPs of a step as the eager model does: its original module's forward and
backward are counted on meta tensors (perfhooks.runtime.throughput.compiled_flops), outside the compiled frame. The
count matches eager's, the compiled graph is not recompiled, and the user's parameters end as they do without
perfhooks. Backend ``aot_eager`` on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import perfhooks

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))

SCHEDULE = perfhooks.Schedule(skip_first=2, warmup=1, active=2)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def _gpt() -> torch.nn.Module:
    from hf_trainer_example import tiny_gpt2

    return tiny_gpt2()


def _loop(model: torch.nn.Module, compiled: bool, out: Path | None, batch: Any, accumulate: int = 1
          ) -> tuple[dict[str, Any] | None, list[torch.Tensor], int]:
    """Eight steps of ``accumulate`` micro-batches; the report (None bare), the final parameters, and the graphs
    dynamo compiled."""
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    called = torch.compile(model, backend="aot_eager") if compiled else model
    session = (perfhooks.profile(called, optimizer, output_dir=out, console=False, schedule=SCHEDULE)
               if out is not None else None)
    torch.manual_seed(1)
    for _ in range(8):
        for _ in range(accumulate):
            output = called(**batch()) if isinstance(batch(), dict) else called(batch())
            loss = output.loss if hasattr(output, "loss") else output.square().mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    report = None
    if session is not None:
        session.close()
        report = json.loads((out / "report.json").read_text())  # type: ignore[operator]
    return report, [p.detach().clone() for p in model.parameters()], counters["stats"]["unique_graphs"]


def _tokens() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 512, (4, 32))
    return {"input_ids": ids, "labels": ids}


@pytest.mark.slow
@pytest.mark.parametrize(("build", "batch", "accumulate"), [(_mlp, lambda: torch.randn(32, 64), 1),
                                                            (_mlp, lambda: torch.randn(32, 64), 2),
                                                            (_gpt, _tokens, 1)])
def test_a_compiled_model_gets_the_eager_models_flops_and_runs_as_without_perfhooks(
        tmp_path: Path, build: Any, batch: Any, accumulate: int) -> None:
    eager, _, _ = _loop(build(), False, tmp_path / "eager", batch, accumulate)
    compiled, params, graphs = _loop(build(), True, tmp_path / "compiled", batch, accumulate)
    _, bare_params, bare_graphs = _loop(build(), True, None, batch, accumulate)
    eager_flops = eager["throughput"]["flops_per_step"]  # type: ignore[index]
    flops = compiled["throughput"]  # type: ignore[index]
    assert flops.get("flops_per_step"), (flops.get("missing"), compiled["faults"], compiled["steps"])  # type: ignore[index]
    assert abs(flops["flops_per_step"] / eager_flops - 1) <= 0.10, (flops["flops_per_step"], eager_flops)
    assert "on meta tensors" in flops["flops_source"]
    assert graphs == bare_graphs, "no recompilation"
    assert all(torch.equal(a, b) for a, b in zip(params, bare_params, strict=True)), "the user's training unchanged"
