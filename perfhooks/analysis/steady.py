"""What in a window is not the steady state, so that the steady-state rules are judged without it.

- **One-time start-up work** (:func:`perfhooks.analysis.kernels.startup_calls`): modules loaded at a kernel's first
  launch, streams, events and the allocator set up.
- **CUDA/HIP graph captures**: between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` the launches are
  recorded into a graph and run nothing, so the device looks idle while the host is busy.
- **Graph set-up and module loads**, whatever their length: instantiating and uploading a captured graph, and
  loading a module or library (lazy loading at a kernel's first launch). A serving engine's warm-up window is
  made of these and the captures; a graph's replays (``cudaGraphLaunch``) are the steady state.
- **First-call work spread over many calls**: an operator that makes dozens of kernel-attribute and occupancy
  queries (cuDNN's heuristics choosing an algorithm at a shape's first call), and a kernel's first launch that
  takes far longer than its later ones (a module loaded lazily at first launch).
- **Compilation**: dynamo and inductor frames and phases in the window.
- **Work queued behind what the trace did not record**: the host launched everything early, and the device ran
  it back to back much later (behind work before the profiler started, or with a clock offset); the time before
  the first kernel is queueing, not idle time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfhooks.analysis import spans
from perfhooks.analysis.columns import ABSENT
from perfhooks.analysis.host import is_compilation, unrecorded_spans
from perfhooks.analysis.kernels import launch_gaps, startup_calls
from perfhooks.analysis.trace import Trace

#: Runtime calls that set a captured graph up, or load code: one-time work of any length (CUDA, the driver, HIP).
SETUP_ANY_LENGTH = ("cudaGraphInstantiate", "cuGraphInstantiate", "hipGraphInstantiate", "cudaGraphUpload",
                    "cuGraphUpload", "hipGraphUpload", "cudaGraphExecUpdate", "hipGraphExecUpdate", "cuModuleLoad",
                    "hipModuleLoad", "cuLibraryLoad", "cudaLibraryLoad")
#: Allocation calls, counted as graph set-up in a window that captures graphs (a capture's warm-up fills the graph's
#: memory pool; a window that captures nothing may be allocating in its steady state).
GRAPH_ALLOCATIONS = ("cudaMalloc", "cudaMallocAsync", "hipMalloc", "hipMallocAsync", "hipExtMallocWithFlags",
                     "cuMemAlloc", "cuMemAlloc_v2", "cuMemCreate", "cudaHostAlloc", "hipHostMalloc")
#: Runtime calls that open and close a stream capture (CUDA and HIP).
BEGIN_CAPTURE = ("cudaStreamBeginCapture", "hipStreamBeginCapture")
END_CAPTURE = ("cudaStreamEndCapture", "hipStreamEndCapture")
#: Below this fraction 0..1 of the window left for the steady state, no steady-state utilization is judged.
MIN_STEADY_SHARE = 0.05
#: At or above this fraction 0..1 of the window in start-up work, captures and compilation, nothing steady is
#: judged from the rest: what is left is as likely first-call work the trace does not name (Python, imports).
MOSTLY_NOT_STEADY = 0.75
#: Runtime calls that ask a kernel's attributes: cheap one by one, made by the hundred when a library picks an
#: algorithm at a shape's first call (cuDNN's heuristics). Occupancy queries are not among them: PyTorch's and
#: Triton's launchers make those at every launch.
QUERY_CALLS = ("cudaFuncGetAttributes", "cuFuncGetAttribute", "hipFuncGetAttributes")
#: An operator making at least this many such queries is choosing algorithms: first-call work.
FIRST_CALL_QUERIES = 50
#: A kernel's first launch is a lazy module load when it takes at least this long (µs) and this many times the
#: median of all launches (below :data:`perfhooks.analysis.kernels.ONE_TIME_CALL_US`, which catches the long ones).
LAZY_LOAD_US = 100.0
LAZY_LOAD_RATIO = 20.0
#: Queueing is read only when the device ran this busy (fraction 0..1) from its first kernel to its last ...
QUEUED_BUSY = 0.90
#: ... and the time before its first kernel was at least this fraction of the window's idle time.
QUEUED_LEAD_OF_IDLE = 0.50


def graph_captures(trace: Trace) -> list[spans.Span]:
    """Each stream capture's span (begin call's start to end call's end, µs), paired per host thread."""
    open_at: dict[Any, float] = {}
    out: list[spans.Span] = []
    runtimes = trace.columns("runtimes")
    for call in sorted(runtimes.take(runtimes.named(trace.names("runtimes", BEGIN_CAPTURE + END_CAPTURE))),
                       key=lambda c: c.ts):
        thread = (call.pid, call.tid)
        if (call.name or "").startswith(BEGIN_CAPTURE):
            open_at.setdefault(thread, call.ts)
        elif thread in open_at:
            out.append((open_at.pop(thread), call.ts + call.dur))
    return spans.merge(out)


def setup_spans(trace: Trace, capturing: bool = False) -> list[spans.Span]:
    """Spans (µs) of graph instantiation and upload and of module loads (:data:`SETUP_ANY_LENGTH`), and, in a
    window that captures graphs (``capturing``), of allocations (:data:`GRAPH_ALLOCATIONS`), merged."""
    runtimes = trace.columns("runtimes")
    rows = runtimes.named(trace.names("runtimes", SETUP_ANY_LENGTH + (GRAPH_ALLOCATIONS if capturing else ()))) & (
        runtimes.dur > 0)
    return spans.merge(zip(runtimes.ts[rows].tolist(), runtimes.end[rows].tolist(), strict=True))


def graph_runtime_share(trace: Trace, captures: list[spans.Span], setup: list[spans.Span]) -> float:
    """The share 0..1 of the runtime calls' time that is graph capture (calls inside a capture) and graph set-up
    (:func:`setup_spans`): why a capturing window's host is busy while its device idles."""
    calls = [(c.ts, c.ts + c.dur) for c in trace.runtimes if c.dur > 0]
    total = sum(end - start for start, end in calls)
    if not total:
        return 0.0
    graph = spans.merge(captures + setup)
    return sum(spans.total(spans.subtract([call], spans.subtract([call], graph))) for call in calls) / total


def first_call_spans(trace: Trace) -> list[spans.Span]:
    """Spans (µs) of first-call work spread over many short calls: operators making at least
    :data:`FIRST_CALL_QUERIES` kernel-attribute queries, and kernels' first launches past
    :data:`LAZY_LOAD_US` and :data:`LAZY_LOAD_RATIO` times the median launch."""
    runtimes, ops = trace.columns("runtimes"), trace.columns("cpu_ops")
    queries = np.sort(runtimes.ts[runtimes.named(trace.names("runtimes", QUERY_CALLS))])
    out: list[spans.Span] = []
    if queries.size >= FIRST_CALL_QUERIES:
        inside = np.searchsorted(queries, ops.end) - np.searchsorted(queries, ops.ts)
        rows = inside >= FIRST_CALL_QUERIES
        out += zip(ops.ts[rows].tolist(), ops.end[rows].tolist(), strict=True)
    launches = np.flatnonzero(runtimes.name_mask(lambda name: "LaunchKernel" in (name or "")))
    if launches.size:
        bound = max(LAZY_LOAD_US, LAZY_LOAD_RATIO * float(np.median(runtimes.dur[launches])))
        launches = launches[np.argsort(runtimes.ts[launches], kind="stable")]
        # the name of the kernel each launch launched (the last kernel of a correlation id, as a dict keeps it)
        kernels = trace.columns("kernels")
        has = np.flatnonzero(kernels.correlation != ABSENT)[::-1]
        ids, last = np.unique(kernels.correlation[has], return_index=True)
        names = kernels.name[has[last]]
        if ids.size:
            slot = np.minimum(np.searchsorted(ids, runtimes.correlation[launches]), ids.size - 1)
            found = ids[slot] == runtimes.correlation[launches]
            launches, name = launches[found], names[slot[found]]
            named = np.asarray([n is not None for n in kernels.names] or [False], dtype=bool)[name]
            launches, name = launches[named], name[named]
            _, first = np.unique(name, return_index=True)  # each kernel's first launch
            first = np.sort(first)
            slow = first[runtimes.dur[launches[first]] >= bound]
            out += zip(runtimes.ts[launches[slow]].tolist(), runtimes.end[launches[slow]].tolist(), strict=True)
    return spans.merge(out)


def compilation_spans(trace: Trace) -> list[spans.Span]:
    """Spans (µs) of compiler frames and phases (dynamo, inductor) in the trace, merged."""
    host = (trace.python, trace.annotations, trace.cpu_ops)
    names = {name for events in host for name in {e.name for e in events} if name and is_compilation(name)}
    if not names:
        return []
    return spans.merge((e.ts, e.ts + e.dur) for events in host for e in events if e.name in names and e.dur > 0)


def steady_state(trace: Trace, window: list[spans.Span], steps: int, device: int | None) -> dict[str, Any]:
    """The window less start-up work, graph captures and compilation: ``{excluded_us, excluded_share, captures,
    capture_us, compile_us, first_call_us, mostly_not_steady, step_us, gpu_utilization}`` (µs per step;
    utilization 0..1 of the steady time, ``None`` when less than :data:`MIN_STEADY_SHARE` of the window is left or
    :data:`MOSTLY_NOT_STEADY` of it is excluded). Empty when nothing is excluded. The window is the recorded one:
    device time the trace does not record (a synchronize's wait on work it does not show) is taken out first."""
    window = spans.subtract(window, unrecorded_spans(trace))
    length = spans.total(window)
    if not length or steps <= 0:
        return {}

    def clipped(found: list[spans.Span]) -> list[spans.Span]:
        return [(max(s, lo), min(e, hi)) for s, e in found for lo, hi in window if s < hi and e > lo]

    captures = clipped(graph_captures(trace))
    compiling = clipped(compilation_spans(trace))
    first_calls = clipped(first_call_spans(trace))
    setup = clipped(setup_spans(trace, capturing=bool(captures)))
    startup = [(c.ts, c.ts + c.dur) for c in startup_calls(trace)]
    holes = spans.merge([(s, e) for s, e in startup if e > s] + captures + compiling + first_calls + setup)
    steady = spans.subtract(window, holes)
    steady_us = spans.total(steady)
    excluded = length - steady_us
    if excluded <= 0:
        return {}
    utilization = None
    mostly = excluded >= MOSTLY_NOT_STEADY * length
    if device is not None and steady_us >= MIN_STEADY_SHARE * length and not mostly:
        kernels = trace.columns("kernels")
        rows = kernels.device == device
        utilization = spans.measure(spans.union((kernels.ts[rows], kernels.end[rows])), steady) / steady_us
    return {"excluded_us": excluded, "excluded_share": excluded / length, "captures": len(captures),
            "capture_us": spans.total(captures), "compile_us": spans.total(spans.merge(compiling)),
            "first_call_us": spans.total(spans.merge(first_calls)), "setup_us": spans.total(spans.merge(setup)),
            "mostly_not_steady": mostly,
            "graph_runtime_share": graph_runtime_share(trace, captures, setup) if captures else 0.0,
            "step_us": steady_us / steps, "gpu_utilization": utilization}


def device_queueing(trace: Trace, window: list[spans.Span], device: int | None) -> dict[str, Any]:
    """Device work that queued behind work the trace did not record: the device busy at least
    :data:`QUEUED_BUSY` from its first kernel to its last, most of the window's idle time before the first kernel,
    and kernels starting a median of at least half that lead after their launch. ``{lead_us, busy_share,
    median_launch_to_start_us}``; empty when the pattern is not there."""
    if device is None or not window:
        return {}
    low, high = window[0][0], window[-1][1]
    columns = trace.columns("kernels")
    rows = (columns.device == device) & (columns.ts >= low) & (columns.ts < high)
    if not rows.any():
        return {}
    first = float(columns.ts[rows].min())
    lead = sum(max(0.0, min(end, first) - start) for start, end in window)
    busy_spans = spans.union((columns.ts[rows], columns.end[rows]))
    idle = spans.total(window) - spans.measure(busy_spans, window)
    if not idle or lead < QUEUED_LEAD_OF_IDLE * idle:  # the common case, decided before the costlier figures
        return {}
    last = float(columns.end[rows].max())
    busy = spans.measure(busy_spans, [(first, last)])
    gaps = launch_gaps(trace, rows)
    if last <= first or not gaps.size:
        return {}
    median_gap = float(np.median(gaps))
    if busy / (last - first) < QUEUED_BUSY or median_gap < QUEUED_LEAD_OF_IDLE * lead:
        return {}
    return {"lead_us": lead, "busy_share": busy / (last - first), "median_launch_to_start_us": median_gap}
