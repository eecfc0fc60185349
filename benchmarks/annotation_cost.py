"""The cost of one annotation, in ns: NVTX ranges, ``record_function`` and an engine phase transition.

    python benchmarks/annotation_cost.py

No NVTX tool is attached (as in a run outside Nsight Systems) and no profiler records. Each figure
is the median of 5 timed loops of 200,000 calls; the published figures it is printed next to are
about 0.5 µs for a bare ``range_push``/``range_pop`` pair and 1.1-1.7 µs for the context managers
(TransformerEngine PR #1447, lightning-thunder PR #1846), measured on other machines.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import describe_machine

CALLS = 200_000
PUBLISHED = {"nvtx_push_pop": "~500 ns (bare range_push/pop)", "nvtx_context": "1100-1700 ns (context managers)"}


def ns_per_call(body: Callable[[int], None], calls: int = CALLS, repeats: int = 5) -> float:
    results = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        body(calls)
        results.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(results)


def measure(calls: int = CALLS) -> dict[str, float]:
    import nvtx
    import torch

    from perfhooks import Engine, PerfConfig
    from perfhooks.capture.nvtx import NvtxRanges

    domain = nvtx.get_domain("perfhooks")
    ranges = NvtxRanges(enabled=True)

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def nvtx_push_pop(n: int) -> None:
        push, pop = nvtx.push_range, nvtx.pop_range
        for _ in range(n):
            push("forward")
            pop()

    def nvtx_domain_push_pop(n: int) -> None:
        attributes = domain.get_event_attributes(message="forward")
        for _ in range(n):
            domain.push_range(attributes)
            domain.pop_range()

    def nvtx_context(n: int) -> None:
        annotate = nvtx.annotate
        for _ in range(n):
            with annotate("forward"):
                pass

    def perfhooks_nvtx(n: int) -> None:
        push, pop = ranges.push, ranges.pop
        for _ in range(n):
            push("forward")
            pop()

    def record_function(n: int) -> None:
        rf = torch.autograd.profiler.record_function
        for _ in range(n):
            with rf("forward"):
                pass

    loop = ns_per_call(empty, calls)
    figures = {name: ns_per_call(fn, calls) - loop for name, fn in (
        ("nvtx_push_pop", nvtx_push_pop), ("nvtx_domain_push_pop", nvtx_domain_push_pop),
        ("nvtx_context", nvtx_context), ("perfhooks_nvtx_push_pop", perfhooks_nvtx),
        ("record_function", record_function))}
    with tempfile.TemporaryDirectory() as out:
        engine = Engine(PerfConfig(schedule=None, console=False, memory=False), out, "benchmark")

        def transitions(n: int) -> None:
            start = engine.phase_start
            for _ in range(n // 2):
                start("forward")
                start("backward")

        figures["engine_phase_transition"] = ns_per_call(transitions, calls) - loop
        engine.close()
    return figures


def main() -> int:
    print(f"machine: {describe_machine()}")
    for name, ns in measure().items():
        print(f"  {name:<26} {ns:8.0f} ns" + (f"   published: {PUBLISHED[name]}" if name in PUBLISHED else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
