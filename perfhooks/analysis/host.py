"""Host behaviour: synchronizations that stall the GPU queue, waits on device work the trace does not record, and
compilation inside the window."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from perfhooks.analysis import spans
from perfhooks.analysis.columns import ABSENT
from perfhooks.analysis.trace import Trace

SYNC_RUNTIME = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "hipDeviceSynchronize",
                "hipStreamSynchronize", "hipEventSynchronize")
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")
#: A synchronize call shorter than this (µs) returned at once: the work it named was done, and the host did not
#: wait (an event already complete costs a call of a few µs). Counted apart, as ``no_wait_per_step``.
NO_WAIT_US = 10.0
#: Names that only compilation produces: dynamo's timed phases (``record_function("... (dynamo_timed)")``) and the
#: frames of tracing, graph lowering and kernel compilation. Frames that run on every call of an already
#: compiled model (``eval_frame.py _fn``, ``TorchDynamo Cache Lookup``, inductor's runtime launchers) are not.
COMPILE_MARKERS = ("(dynamo_timed)", "_compile.compile_inner", "compile_fx_inner", "OutputGraph.call_user_compiler")
#: Files whose frames are compilation, except for the functions in them that run on every call of compiled code
#: (inductor's ``compile_fx.py`` defines the ``run``/``wrapper`` closures a compiled graph calls each time).
COMPILE_FILES = ("torch/_dynamo/convert_frame.py", "torch/_dynamo/symbolic_convert.py", "torch/_dynamo/output_graph.py",
                 "torch/_inductor/compile_fx.py", "torch/_inductor/graph.py", "torch/_inductor/codecache.py",
                 "torch/_inductor/async_compile.py")
RUNTIME_FUNCTIONS = frozenset({"run", "wrapper", "__call__", "call", "_fn", "inner", "forward", "g", "<lambda>"})
COMPILED_REGION_MARKERS = ("Torch-Compiled Region", "CompiledFunction", "CompiledFxGraph")


def host_synchronizations(trace: Trace, steps: int) -> dict[str, Any]:
    """Syncs per step by kind, their total host time, and call sites when stacks were recorded. A synchronize
    call that returned at once (under :data:`NO_WAIT_US`) did not wait: it is counted in ``no_wait_per_step``.

    Only syncs inside a host ``ProfilerStep``, after the step launched device work, count (the whole
    trace is one step when it has none): a ``cudaDeviceSynchronize`` before that waits for work that is
    not the step's. Each sync counts once: a ``.item()`` is ``aten::item`` around
    ``aten::_local_scalar_dense`` around a stream synchronize, and only the outermost of nested
    candidates on one thread is counted, with its own duration. An ``.item()`` that made no sync or
    copy call (a CPU tensor's) is no sync.
    """
    runtimes, ops = trace.columns("runtimes"), trace.columns("cpu_ops")
    candidates = runtimes.take(runtimes.named(trace.names("runtimes", SYNC_RUNTIME)))
    if trace.has_gpu:  # without a device, .item() waits for nothing
        candidates += _waits_for_the_device(ops.take(ops.named(SYNC_OPS)), trace)
    inside = _inside_steps(candidates, trace)
    counted = _outermost(inside)
    counts: dict[str, int] = {}
    no_wait = 0
    time_us = idle_us = 0.0
    sites: dict[str, int] = {}
    busy = _device_busy(trace) if trace.has_gpu else None
    step_ends = sorted(end for _, _, end in trace.steps)
    for event in counted:
        name = event.name or ""
        time_us += event.dur
        if event.dur < NO_WAIT_US and name not in SYNC_OPS:
            no_wait += 1
            continue
        counts[name] = counts.get(name, 0) + 1
        idle_us += event.dur if busy is None else _idle_because_of(event, busy, step_ends)
        stack = event.a.call_stack if name in SYNC_OPS else None
        if isinstance(stack, str) and stack:
            site = _user_frame(stack)
            sites[site] = sites.get(site, 0) + 1
    if not sites and trace.python:
        sites = _python_call_sites([event for event in counted if event.name in SYNC_OPS], trace)
    syncs = sum(counts.values())
    per_step = max(steps, 1)
    return {
        "per_step": syncs / per_step,
        "by_kind_per_step": {name: count / per_step for name, count in sorted(counts.items())},
        "no_wait_per_step": no_wait / per_step,
        "time_us_per_step": time_us / per_step,
        # what the syncs cost the device: its idle time during each and until the host gave it work again
        "device_idle_us_per_step": idle_us / per_step,
        "outside_steps": len(_outermost(candidates)) - syncs - no_wait,
        "call_sites": [{"site": site, "count": count} for site, count in
                       sorted(sites.items(), key=lambda kv: -kv[1])[:5]],
        "cuda_sync_events": len(trace.syncs),
    }


def _device_busy(trace: Trace) -> spans.Spans:
    """When the device was doing anything: kernels (communication included), copies and memsets, merged."""
    device = trace.columns("device_events")
    return spans.union((device.ts, device.end))


def _idle_because_of(sync: Any, busy: spans.Spans, step_ends: list[float]) -> float:
    """The device time (µs) a sync cost: the device's idle time during it, plus the device's idle time after it
    until the step's end, up to the time the device was busy during the wait. A host that waits on a busy device
    was ahead of it; after the wait the queue is empty, and every gap until the step ends is one the host, had it
    not waited, could have filled with at most that much of a lead. So a sync on a busy device followed by a
    device that stays fed costs nothing, and no sync costs more than its own length."""
    start, end = sync.ts, sync.ts + sync.dur
    during = sync.dur - spans.measure(busy, [(start, end)])
    starts, ends = busy
    if starts.size == 0:
        return during
    index = bisect.bisect_left(step_ends, end)
    limit = min(step_ends[index] if index < len(step_ends) else float("inf"), float(ends[-1]))
    after = (limit - end) - spans.measure(busy, [(end, limit)]) if limit > end else 0.0
    return during + min(max(0.0, after), sync.dur - during)


def _inside_steps(events: list[Any], trace: Trace) -> list[Any]:
    """The events that start inside a host step, after the step's first launch of device work.

    A sync before a step has launched anything waits for work that is not the step's (a
    ``cudaDeviceSynchronize`` at the top of the step, after a warm-up outside it). Without step
    markers the whole trace is one step.
    """
    runtimes = trace.columns("runtimes")
    launches = np.sort(runtimes.ts[np.isin(runtimes.correlation, _device_correlations(trace))]).tolist()
    steps = sorted((start, end) for _, start, end in trace.steps)
    if not steps:
        steps = [(float("-inf"), float("inf"))]
    starts = [start for start, _ in steps]
    first_launch = []
    for start, end in steps:
        index = bisect.bisect_left(launches, start)
        # a step with no launch recorded (no runtime events in the trace): from its start
        first_launch.append(launches[index] if index < len(launches) and launches[index] < end else start)
    out = []
    for event in events:
        index = bisect.bisect_right(starts, event.ts) - 1
        if index >= 0 and first_launch[index] <= event.ts < steps[index][1]:
            out.append(event)
    return out


def _device_correlations(trace: Trace) -> np.ndarray:
    """The correlation ids of the device activity (sorted, distinct)."""
    correlation = trace.columns("device_events").correlation
    return np.unique(correlation[correlation != ABSENT])


def _waits_for_the_device(ops: list[Any], trace: Trace) -> list[Any]:
    """The ``.item()``-like ops that really waited: a sync or a copy runtime call ran inside them (a CPU
    tensor's ``.item()`` makes none)."""
    by_thread: dict[Any, list[tuple[float, float]]] = {}
    if not ops:
        return []
    runtimes = trace.columns("runtimes")
    for runtime in runtimes.take(runtimes.name_mask(lambda name: (name or "").startswith(SYNC_RUNTIME)
                                                    or "Memcpy" in (name or ""))):
        by_thread.setdefault(runtime.tid, []).append((runtime.ts, runtime.ts + runtime.dur))
    for calls in by_thread.values():
        calls.sort()
    out = []
    for op in ops:
        calls = by_thread.get(op.tid, [])
        index = bisect.bisect_left(calls, (op.ts, float("-inf")))
        if index < len(calls) and calls[index][0] <= op.ts + op.dur:
            out.append(op)
    return out


def _outermost(events: list[Any]) -> list[Any]:
    """Drop every event that lies within another on the same thread (a sync inside the op that made it)."""
    out = []
    by_thread: dict[Any, list[Any]] = {}
    for event in events:
        by_thread.setdefault(event.tid, []).append(event)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e.ts, -e.dur))
        end = float("-inf")
        for event in thread_events:
            if event.ts < end and event.ts + event.dur <= end:
                continue  # nested in an earlier, outer one
            out.append(event)
            end = max(end, event.ts + event.dur)
    return out


def _python_call_sites(ops: list[Any], trace: Trace) -> dict[str, int]:
    """Innermost user (non-torch) Python frame around each op, from ``python_function`` events (with_stack)."""
    if not ops:
        return {}
    python = trace.columns("python")
    tid, tids = python.tid, python.tids
    order = np.lexsort((python.ts, tid))  # by thread, then start (equal starts in the trace's order)
    bounds = np.searchsorted(tid[order], np.arange(len(tids) + 1), side="left").tolist()
    starts, frames = python.ts[order], python.events
    thread_of = {value: code for code, value in enumerate(tids)}
    sites: dict[str, int] = {}
    for op in ops:
        code = thread_of.get(op.tid)
        if code is None:
            continue
        low, high = bounds[code], bounds[code + 1]
        index = low + int(np.searchsorted(starts[low:high], op.ts, side="right"))
        best = None
        for row in reversed(order[max(low, index - 200):index].tolist()):  # nearest enclosing frames first
            frame = frames[row]
            name = frame.name or ""
            if (frame.ts + frame.dur >= op.ts and "torch/" not in name and "site-packages" not in name
                    and not name.startswith("<built-in")):  # the call itself (".item"), not a place in the code
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


def is_compilation(name: str) -> bool:
    """A trace name that only compilation produces: a dynamo-timed phase, a compiler entry point, or a Python
    frame (``path(line): function``) of a compiler file whose function is not one that compiled code runs."""
    if any(marker in name for marker in COMPILE_MARKERS):
        return True
    if not any(file in name for file in COMPILE_FILES):
        return False
    function = name.rsplit("): ", 1)[-1].strip() if "): " in name else ""
    return function not in RUNTIME_FUNCTIONS


def compilation(trace: Trace) -> dict[str, bool]:
    """Whether a ``torch.compile``d region ran and whether compilation itself fell in the window."""
    names = {name or "" for kind in ("python", "annotations", "cpu_ops") for name in trace.names(kind, "")}
    return {
        "compiled_region": any(marker in name for name in names for marker in COMPILED_REGION_MARKERS),
        "compiling_in_window": any(is_compilation(name) for name in names),
    }


# ----------------------------------------------------------------------------- device work the trace does not show
# A synchronize returns when the device has finished the work it names. A host that sits 115 ms in 26 device
# synchronizes while the trace records 0.84 ms of device work in them waited on work the tracer did not record:
# graph replays it does not trace, warm-up runs of captured graphs, another process's kernels, or a device clock
# offset against the host's. That time is unrecorded, not idle: utilization is judged without it, no verdict comes
# from it, and the report says it (``metrics.unrecorded``; the ``unrecorded_device_work`` verdict).

#: Runtime and driver calls that wait for the device, a stream or an event (CUDA and HIP).
WAITING_CALLS = ("cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize", "cudaStreamSynchronize",
                 "hipStreamSynchronize", "cuStreamSynchronize", "cudaEventSynchronize", "hipEventSynchronize",
                 "cuEventSynchronize")
#: A wait's part after the last device work recorded in it counts as unrecorded from this long (µs) ...
UNRECORDED_MIN_US = 1_000.0
#: ... and when it is at least this share 0..1 of the wait.
UNRECORDED_SHARE = 0.5


def unrecorded_waits(trace: Trace) -> dict[str, Any]:
    """``{syncs, wait_us, device_us, unrecorded_us, spans}``: the synchronizes that waited on work the trace does
    not record (their count, their total length, the device work recorded inside them, and the unrecorded part:
    from the end of the last recorded device work inside each, or its start, to its return; µs), with those
    parts' spans. Empty when there is none. Cached on the trace."""
    cached = trace.__dict__.get("_unrecorded")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    runtimes = trace.columns("runtimes")
    waits = sorted(runtimes.take(runtimes.named(trace.names("runtimes", WAITING_CALLS))
                                 & (runtimes.dur >= UNRECORDED_MIN_US)), key=lambda call: call.ts)
    found: dict[str, Any] = {}
    if waits:
        device = trace.columns("device_events")
        busy = spans.union((device.ts, device.end))
        starts, ends = busy
        parts, wait_us, device_us = [], 0.0, 0.0
        for call in waits:
            start, end = call.ts, call.ts + call.dur
            recorded = spans.measure(busy, [(start, end)])
            # where the last recorded device work that began before the wait's return ended (within the wait)
            index = int(np.searchsorted(starts, end, side="left")) - 1
            last = min(float(ends[index]), end) if index >= 0 else start
            tail = end - max(start, last)
            if tail >= UNRECORDED_MIN_US and tail >= UNRECORDED_SHARE * call.dur:
                parts.append((end - tail, end))
                wait_us += call.dur
                device_us += recorded
        if parts:
            merged = spans.merge(parts)
            found = {"syncs": len(parts), "wait_us": wait_us, "device_us": device_us,
                     "unrecorded_us": spans.total(merged), "spans": merged}
    trace.__dict__["_unrecorded"] = found
    return found


def unrecorded_spans(trace: Trace) -> list[spans.Span]:
    """The spans (µs) the device's utilization is not judged over: device time the trace does not record (see
    :func:`unrecorded_waits`) and the host's time inside a synchronize frame after its device call returned (see
    :func:`sync_tails`)."""
    return spans.merge([*(unrecorded_waits(trace).get("spans") or []), *(sync_tails(trace).get("spans") or [])])


# ----------------------------------------------------------------------------- a synchronize frame's host tail
# A Python ``torch.cuda.synchronize`` frame (and the built-in ``_cuda_synchronize`` inside it) can last long after
# its runtime call returned: on a held-out MI300X trace, 322 ms after a 1.42 ms hipDeviceSynchronize, with no child,
# no runtime call and no device activity recorded. The device was done; that time is the host's, and the trace cannot
# say what it was. It is said (``metrics.sync_tail``; the ``host_after_sync`` verdict) and not judged as device idle.


#: Host events after the call returned (a device context's ``__exit__``) leave the tail bare up to this share of it.
BOOKKEEPING_SHARE = 0.05


def is_sync_frame(name: str) -> bool:
    """A Python frame or built-in that synchronizes the device: ``torch/cuda/__init__.py(N): synchronize`` (any
    device module's), ``<built-in method _cuda_synchronize ...>``."""
    return name.endswith("): synchronize") or ("built-in" in name and "_synchronize" in name)


def sync_tails(trace: Trace) -> dict[str, Any]:
    """``{frames, tail_us, spans}``: the synchronize frames whose device call returned long before they did, with
    nothing recorded after it inside them (no host event starts there, no device activity runs there): from the
    later of the call's return and the last device work inside the frame, to the frame's end, at least
    :data:`UNRECORDED_MIN_US` and :data:`UNRECORDED_SHARE` of the frame. Nested frames count once. Empty when there
    is none. Cached on the trace."""
    cached = trace.__dict__.get("_sync_tails")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    python = trace.columns("python")
    names = {name for name in trace.names("python", "") if name and is_sync_frame(name)}
    frames = python.take(python.named(names) & (python.dur >= UNRECORDED_MIN_US)) if names else []
    found: dict[str, Any] = {}
    if frames:
        runtimes = trace.columns("runtimes")
        waiting = runtimes.named(trace.names("runtimes", WAITING_CALLS))
        call_starts, call_ends = runtimes.ts[waiting], runtimes.end[waiting]
        device_ends = np.sort(trace.columns("device_events").end)
        # every other host event, by start (then length)
        host = [trace.columns(kind) for kind in ("cpu_ops", "runtimes", "python")]
        kept = [~c.named(names) for c in host]
        starts = np.concatenate([c.ts[k] for c, k in zip(host, kept, strict=True)])
        durations = np.concatenate([c.dur[k] for c, k in zip(host, kept, strict=True)])
        order = np.lexsort((durations, starts))
        starts, ends = starts[order], (starts + durations)[order]
        parts = []
        for frame in frames:
            start, end = frame.ts, frame.ts + frame.dur
            inside = call_ends[(call_starts >= start) & (call_ends <= end)]
            if not inside.size:
                continue
            done = float(inside.max())
            last = int(np.searchsorted(device_ends, end, side="right")) - 1
            if last >= 0 and device_ends[last] > done:
                done = float(device_ends[last])
            tail = end - done
            first = int(np.searchsorted(starts, start, side="left"))  # the frame's own children and what follows
            stop = max(first, int(np.searchsorted(starts, end, side="left")))
            overlap = np.minimum(ends[first:stop], end) - np.maximum(starts[first:stop], done)
            ran = float(overlap[overlap > 0].sum())
            if ran > BOOKKEEPING_SHARE * tail:
                continue  # something ran after the call returned: not a bare tail
            if tail >= UNRECORDED_MIN_US and tail >= UNRECORDED_SHARE * frame.dur:
                parts.append((done, end))
        if parts:
            merged = spans.merge(parts)
            found = {"frames": len(merged), "tail_us": spans.total(merged), "spans": merged}
    trace.__dict__["_sync_tails"] = found
    return found


def sync_tail_section(trace: Trace) -> dict[str, Any]:
    """``metrics.sync_tail``: :func:`sync_tails` without its spans, with the recorded device work's own figures:
    ``device_us`` (busy, all devices' activity as one union), ``device_span_us`` (its first start to its last end)
    and ``device_busy_share`` (their ratio). Empty when there is none."""
    found = {key: value for key, value in sync_tails(trace).items() if key != "spans"}
    device = trace.columns("device_events")
    if found and len(device):
        first, last = float(device.ts.min()), float(device.end.max())
        busy, span = spans.measure(spans.union((device.ts, device.end)), [(first, last)]), last - first
        found.update(device_us=busy, device_span_us=span, device_busy_share=round(busy / span, 4) if span else None)
    return found


def unrecorded_section(trace: Trace) -> dict[str, Any]:
    """``metrics.unrecorded``: :func:`unrecorded_waits` without its spans (empty when there is none)."""
    found = unrecorded_waits(trace)
    return {key: value for key, value in found.items() if key != "spans"}
