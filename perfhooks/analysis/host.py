"""Host behaviour: synchronizations that stall the GPU queue, and compilation inside the window."""

from __future__ import annotations

from typing import Any

from perfhooks.analysis.model import Trace

SYNC_RUNTIME = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "hipDeviceSynchronize",
                "hipStreamSynchronize", "hipEventSynchronize")
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")
COMPILE_MARKERS = ("torch/_dynamo", "torch._dynamo", "compile_fx", "_compile.compile_inner", "OutputGraph",
                   "async_compile", "triton.compiler", "CompilationFunction", "inductor", "TorchDynamo")
COMPILED_REGION_MARKERS = ("Torch-Compiled Region", "CompiledFunction", "CompiledFxGraph")


def host_synchronizations(trace: Trace, steps: int) -> dict[str, Any]:
    """Syncs per step by kind, their total host time, and call sites when stacks were recorded."""
    counts: dict[str, int] = {}
    time_us = 0.0
    sites: dict[str, int] = {}
    for event in trace.runtimes:
        name = event.name or ""
        if name.startswith(SYNC_RUNTIME):
            counts[name] = counts.get(name, 0) + 1
            time_us += event.dur
    for op in trace.cpu_ops if trace.has_gpu else ():  # without a device, .item() waits for nothing
        name = op.name or ""
        if name in SYNC_OPS:
            counts[name] = counts.get(name, 0) + 1
            if name == "aten::item":
                time_us += op.dur
            stack = op.a.call_stack
            if isinstance(stack, str) and stack:
                site = _user_frame(stack)
                sites[site] = sites.get(site, 0) + 1
    if not sites and trace.python:
        sites = _python_call_sites([op for op in trace.cpu_ops if op.name in SYNC_OPS] if trace.has_gpu else [],
                                   trace.python)
    syncs = sum(counts.values())
    per_step = max(steps, 1)
    return {
        "per_step": syncs / per_step,
        "by_kind_per_step": {name: count / per_step for name, count in sorted(counts.items())},
        "time_us_per_step": time_us / per_step,
        "call_sites": [{"site": site, "count": count} for site, count in
                       sorted(sites.items(), key=lambda kv: -kv[1])[:5]],
        "cuda_sync_events": len(trace.syncs),
    }


def _python_call_sites(ops: list[Any], frames: list[Any]) -> dict[str, int]:
    """Innermost user (non-torch) Python frame around each op, from ``python_function`` events (with_stack)."""
    import bisect

    by_thread: dict[Any, list[Any]] = {}
    for frame in frames:
        by_thread.setdefault(frame.tid, []).append(frame)
    starts = {}
    for tid, thread_frames in by_thread.items():
        thread_frames.sort(key=lambda f: f.ts)
        starts[tid] = [f.ts for f in thread_frames]
    sites: dict[str, int] = {}
    for op in ops:
        thread_frames = by_thread.get(op.tid)
        if not thread_frames:
            continue
        index = bisect.bisect_right(starts[op.tid], op.ts)
        best = None
        for frame in reversed(thread_frames[max(0, index - 200):index]):  # nearest enclosing frames first
            name = frame.name or ""
            if frame.ts + frame.dur >= op.ts and "torch/" not in name and "site-packages" not in name:
                best = name
                break
        if best:
            sites[best] = sites.get(best, 0) + 1
    return sites


def _user_frame(stack: str) -> str:
    frames = [frame for frame in stack.split(";") if frame]
    for frame in frames:
        if "site-packages/torch" not in frame and "/torch/" not in frame:
            return frame
    return frames[0] if frames else "?"


def compilation(trace: Trace) -> dict[str, bool]:
    """Whether a ``torch.compile``d region ran and whether compilation itself fell in the window."""
    names = {e.name or "" for e in trace.python + trace.annotations + trace.cpu_ops}
    return {
        "compiled_region": any(marker in name for name in names for marker in COMPILED_REGION_MARKERS),
        "compiling_in_window": any(marker in name for name in names for marker in COMPILE_MARKERS),
    }
