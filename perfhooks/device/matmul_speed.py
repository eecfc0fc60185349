"""How fast this CPU runs the run's own matmuls in fp32 and in bf16: the precision verdicts' measurement.

Once a run, at a full publication (never per step), on a CPU run: the models' largest ``nn.Linear`` shapes at the
rows (tokens or samples) a micro-batch takes, each timed as a training step runs it: fp32 as three matmuls (the
forward and the backward's two), bf16 as autocast runs it, casting the input and the weight first. Best of a few
repeats, about 20 ms of the training thread in all. A GPU run is not probed: timing it would wait on the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

_perf_counter: Callable[[], float] = time.perf_counter
_linear = torch.nn.functional.linear

#: The largest shapes timed, the rows a probe takes at most, the repeats (best of), and the time (s) each
#: dtype's timing may take (it stops early past it).
SHAPES = 3
MAX_ROWS = 2048
#: A shape's rows are cut so that its forward matmul is at most this many multiply-adds (a large model's layer is
#: timed on fewer rows, and its time scaled to the micro-batch's rows): a CPU without native bf16 runs it at a few
#: GFLOP/s, and the probe stays within about 30 ms of one step.
MAX_MACS = 10**6
REPEATS = 3
BUDGET_S = 0.01


def linear_shapes(models: Iterable[Any]) -> list[tuple[int, int, int]]:
    """``(in_features, out_features, count)`` of the models' Linear layers, the largest (in x out x count) first."""
    counts: dict[tuple[int, int], int] = {}
    for model in models:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                key = (module.in_features, module.out_features)
                counts[key] = counts.get(key, 0) + 1
    return sorted(((i, o, n) for (i, o), n in counts.items()), key=lambda s: -s[0] * s[1] * s[2])


def _best(run: Callable[[], Any]) -> float:
    run()  # warm-up: the kernel's first call
    best = float("inf")
    spent = 0.0
    for _ in range(REPEATS):
        start = _perf_counter()
        run()
        took = _perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > BUDGET_S:
            break
    return best


def _time_shape(rows: int, inputs: int, outputs: int, generator: torch.Generator) -> tuple[float, float]:
    """``(fp32 s, bf16 s)`` of one Linear shape's training matmuls (forward, the input's and the weight's
    gradients); bf16 casts its operands first, as autocast does."""
    x = torch.randn(rows, inputs, generator=generator)  # perfhooks' own generator: the user's random state stays
    w = torch.randn(outputs, inputs, generator=generator)
    grad = torch.randn(rows, outputs, generator=generator)

    def full() -> None:
        _linear(x, w)
        grad @ w
        grad.t() @ x

    def half() -> None:
        xh, wh, gh = x.bfloat16(), w.bfloat16(), grad.bfloat16()
        _linear(xh, wh)
        gh @ wh
        gh.t() @ xh

    return _best(full), _best(half)


def measure(models: Iterable[Any], rows: int) -> dict[str, Any] | None:
    """``{fp32_ms, bf16_ms, dtype, shapes, shapes_said}``: the run's largest Linear shapes (``shapes``: ``[rows
    timed, in, out, layers]`` each; the rows timed are ``rows``, cut by :data:`MAX_ROWS` and :data:`MAX_MACS`), in
    fp32 and in bf16 with its casts: ms a micro-batch of ``rows`` rows takes in them, every layer of each shape
    counted (the time scaled from the rows timed); None where the models have no Linear layer."""
    shapes = linear_shapes(models)[:SHAPES]
    if not shapes or rows <= 0:
        return None
    generator = torch.Generator().manual_seed(0)
    fp32 = bf16 = 0.0
    timed = []
    with torch.no_grad():
        for inputs, outputs, count in shapes:
            taken = max(1, min(rows, MAX_ROWS, MAX_MACS // (inputs * outputs)))
            timed.append((taken, inputs, outputs, count))
            full, half = _time_shape(taken, inputs, outputs, generator)
            scale = count * rows / taken  # the layers' matmuls at the micro-batch's rows (linear in the rows)
            fp32, bf16 = fp32 + scale * full, bf16 + scale * half
    said = ", ".join(f"{count} x [{taken}, {inputs}] @ [{inputs}, {outputs}]"
                     for taken, inputs, outputs, count in timed)
    return {"fp32_ms": round(fp32 * 1e3, 4), "bf16_ms": round(bf16 * 1e3, 4), "dtype": "bf16",
            "shapes": [list(shape) for shape in timed], "shapes_said": said}
