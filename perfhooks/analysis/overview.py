"""The TensorBoard profiler plugin's overview, from its published definitions.

(kineto ``tb_plugin/docs/gpu_utilization.md`` and the plugin's step and breakdown rules.)

- **Steps** are the ``ProfilerStep#N`` spans, moved to the device side: a step ends when
  the last device activity launched from inside it ends, and starts no earlier than the
  previous step ends. Trailing steps whose device work was not fully captured are dropped.
- **Breakdown**: each step's time goes to the first role that covers it, in the order
  kernel, memcpy, memset, communication, runtime, DataLoader, CPU exec; the rest is other.
- **GPU utilization**: time with at least one kernel running ÷ all steps time.
- **Est. SM efficiency**: Σ min(blocks per SM, 1) × kernel time ÷ all steps time (kernels
  that overlap add up, capped at 1).
- **Est. achieved occupancy**: kernel-time-weighted mean of the compute kernels' estimated
  achieved occupancy (percent); communication kernels, which run a few blocks by design, are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from perfhooks.analysis import spans
from perfhooks.analysis.columns import ABSENT, Columns
from perfhooks.analysis.host import SYNC_RUNTIME, unrecorded_spans
from perfhooks.analysis.trace import Event, Trace

ROLES: tuple[str, ...] = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec",
                          "other")
COMMUNICATION_OPS = ("nccl:", "gloo:", "rccl:", "c10d::", "record_param_comms")
COMMUNICATION_KERNELS = ("nccl", "rccl", "ncclDevKernel", "ncclKernel")
#: Communication libraries' kernel families, matched anywhere in a kernel's name (C++ names start with
#: ``void``), with where the names come from.
COMMUNICATION_KERNEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("NCCL", r"\bnccl"),  # NVIDIA/nccl: ncclDevKernel_*, ncclKernel_*
    ("RCCL", r"\brccl"),  # ROCm/rccl
    ("DeepEP", r"deep_ep::(?:internode|intranode|internode_ll)::"),  # deepseek-ai/DeepEP csrc/kernels: dispatch,
    # combine, notify_dispatch, ...
    ("NVSHMEM", r"\bnvshmem"),  # NVIDIA NVSHMEM device kernels
    ("MSCCL++", r"mscclpp"),  # microsoft/mscclpp
    ("custom all-reduce", r"cross_device_reduce_[12]stage"),  # vLLM / SGLang csrc/custom_all_reduce.cuh
)
_COMMUNICATION_KERNEL = re.compile("|".join(pattern for _, pattern in COMMUNICATION_KERNEL_FAMILIES))
DATALOADER_PREFIX = "enumerate(DataLoader)#"


@dataclass
class Overview:
    steps: list[tuple[int, float, float]]
    #: Mean time per step of each role, µs.
    breakdown_us: dict[str, float]
    step_us: float
    gpu_utilization: dict[int, float] = field(default_factory=dict)
    sm_efficiency: dict[int, float | None] = field(default_factory=dict)
    achieved_occupancy: dict[int, float | None] = field(default_factory=dict)

    #: How many steps the trace's steps make: their count, less what a window stopped inside its last step did
    #: not record (:meth:`weigh_last`).
    step_count: float = 0.0

    def share(self, role: str) -> float:
        return self.breakdown_us[role] / self.step_us if self.step_us else 0.0

    def weigh_last(self, share: float) -> None:
        """The last step holds only ``share`` 0..1 of its micro-batches (a window stopped inside it at its memory
        bound): it counts as that share of a step, so that the per-step figures (the step's time, each role's)
        are a whole step's, weighted by the micro-batches recorded."""
        count = len(self.steps)
        if not count or not 0 < share < 1:
            return
        weighted = count - 1 + share
        self.step_us = self.step_us * count / weighted
        self.breakdown_us = {role: us * count / weighted for role, us in self.breakdown_us.items()}
        self.step_count = weighted

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.step_count or len(self.steps),
            "step_us": self.step_us,
            "breakdown_us": dict(self.breakdown_us),
            "gpu_utilization": {str(k): v for k, v in self.gpu_utilization.items()},
            "sm_efficiency": {str(k): v for k, v in self.sm_efficiency.items()},
            "achieved_occupancy": {str(k): v for k, v in self.achieved_occupancy.items()},
        }


def communication_ids(trace: Trace) -> set[Any]:
    """External ids of communication collectives (NCCL, RCCL, gloo); computed once per trace."""
    cached = trace.__dict__.get("_communication_ids")
    if cached is not None:
        return cached
    ops = trace.columns("cpu_ops")
    found = ops.external_id[ops.named(trace.names("cpu_ops", COMMUNICATION_OPS))]
    ids = set(found[found != ABSENT].tolist())
    collectives = trace.names("annotations", COMMUNICATION_OPS)
    for event in trace.annotations:
        if event.name in collectives:
            ext = event.external_id
            if ext is not None:
                ids.add(ext)
    trace.__dict__["_communication_ids"] = ids
    return ids


def is_communication_kernel(kernel: Event, comm_ids: set[Any]) -> bool:
    return _communication_name(kernel.name or "") or (bool(comm_ids) and kernel.external_id in comm_ids)


def communication_kernels(trace: Trace) -> np.ndarray:
    """Which rows of ``trace.columns("kernels")`` are collectives (:func:`is_communication_kernel`); cached."""
    cached = trace.__dict__.get("_communication_kernels")
    if cached is not None:
        return cached
    kernels = trace.columns("kernels")
    mask = kernels.name_mask(lambda name: _communication_name(name or ""))
    ids = communication_ids(trace)
    if ids:
        mask |= np.isin(kernels.external_id, np.fromiter(ids, dtype=np.int64, count=len(ids)))
    trace.__dict__["_communication_kernels"] = mask
    return mask


@lru_cache(maxsize=65536)
def _communication_name(name: str) -> bool:
    """Whether a kernel's name is a collective's (tested once per distinct name)."""
    return name.startswith(COMMUNICATION_KERNELS) or _COMMUNICATION_KERNEL.search(name) is not None


#: How the steps of a trace were found (``metrics.step_rule``).
STEP_RULES = {
    "profiler_steps": "the ProfilerStep#N spans, each extended to the end of the device work it launched",
    "host_window": "no ProfilerStep: one step from the first host event to the end of the last device work "
                   "launched from it (a synchronization at either edge is not a host event of its own)",
    "device_only": "no host events: one step from the first to the last device activity",
    "none": "no events with a duration",
}


def step_rule(trace: Trace) -> str:
    """Which rule of :data:`STEP_RULES` defines the trace's steps."""
    if trace.steps:
        return "profiler_steps"
    if trace.cpu_ops or trace.python or trace.annotations or trace.runtimes:
        return "host_window"
    return "device_only" if trace.has_gpu else "none"


#: Python frames of the profiler stopping (``torch/profiler/profiler.py``); ``record_function``'s ``__exit__``
#: lives in ``torch/autograd/profiler.py`` and is the user's own range, not teardown.
PROFILER_TEARDOWN = ("): __exit__", "): stop", "): stop_trace", "): _transit_action")


def _is_profiler_teardown(name: str) -> bool:
    return "torch/profiler/profiler.py(" in name and name.endswith(PROFILER_TEARDOWN)


#: A set of host events as ``(starts, ends)`` arrays (µs).
HostSpans = tuple[np.ndarray, np.ndarray]


def _host_spans(trace: Trace) -> list[HostSpans]:
    """The host events of a step-less window, by kind: operators, Python frames, annotations, and runtime calls
    less synchronizations (all runtime calls where the trace has nothing else)."""
    runtimes = trace.columns("runtimes")
    calls = ~_synchronizations(trace)
    host = [(c.ts, c.end) for c in (trace.columns("cpu_ops"), trace.columns("python"), trace.columns("annotations"))
            if len(c)]
    if calls.any():
        host.append((runtimes.ts[calls], runtimes.end[calls]))
    return host or [(runtimes.ts, runtimes.end)]


def _synchronizations(trace: Trace) -> np.ndarray:
    """Which runtime calls synchronize (:data:`~perfhooks.analysis.host.SYNC_RUNTIME`)."""
    return trace.columns("runtimes").name_mask(lambda name: (name or "").startswith(SYNC_RUNTIME))


def _whole_trace_step(trace: Trace) -> list[tuple[int, float, float]]:
    """One step over the host events (the device side is added by the launches, as for any step), or over
    the device events when the trace has no host side."""
    rule = step_rule(trace)
    if rule == "host_window":
        # a synchronization at either edge (the profiler's own at stop: torch.autograd.profiler's __exit__ calls
        # the device's synchronize()) waits for the window's work: it is not work of its own
        host = _host_spans(trace)
        # the profiler's own stop (and what runs inside it: a synchronize, the trace's collection) is teardown,
        # not the window's work: recorded with stacks it can outlast the last kernel by most of a second
        python = trace.columns("python")
        teardown = python.name_mask(lambda name: bool(name) and _is_profiler_teardown(name)) if len(python) else None
        if teardown is not None and teardown.any():
            lows, highs = python.ts[teardown], python.end[teardown]
            first = float(lows.min())
            kept = []
            for starts, ends in host:
                inside = np.zeros(starts.size, dtype=bool)
                for low, high in zip(lows.tolist(), highs.tolist(), strict=True):
                    inside |= (starts >= low) & (ends <= high)
                keep = (starts < first) | ~inside
                if keep.any():
                    kept.append((starts[keep], ends[keep]))
            host = kept or host
        start = activity_start(trace) or min(float(starts.min()) for starts, _ in host)
        return [(0, start, _teardown_cut(trace, host) or max(float(ends.max()) for _, ends in host))]
    if rule == "device_only":
        device = trace.columns("device_events")
        return [(0, float(device.ts[0]), float(device.end.max()))]
    return []


def activity_start(trace: Trace) -> float | None:
    """Where a step-less window's activity starts: its first operator or runtime call (a synchronization left
    out; its first device activity where it has neither). Python frames and annotations before it (the
    profiler's start, a script's idle lead-in) are the capture's lead-in, not the program's work. None where
    there is none of those."""
    ops, runtimes = trace.columns("cpu_ops"), trace.columns("runtimes")
    calls = runtimes.ts[~_synchronizations(trace)]
    firsts = [float(times.min()) for times in (ops.ts, calls) if times.size]
    device = trace.columns("device_events")
    if not firsts and len(device):  # device work that starts before any host call was queued before it
        firsts.append(float(device.ts[0]))
    return min(firsts) if firsts else None


def lead_in_us(trace: Trace) -> float:
    """µs between a step-less window's first host event and the start of its activity (0 with step markers)."""
    if step_rule(trace) != "host_window":
        return 0.0
    start = activity_start(trace)
    host = [float(trace.columns(kind).ts.min()) for kind in ("cpu_ops", "python", "annotations", "runtimes")
            if getattr(trace, kind)]
    return max(0.0, start - min(host)) if start is not None and host else 0.0


def _teardown_cut(trace: Trace, host: list[HostSpans]) -> float | None:
    """The end of a step-less window whose host outlives its device work: its last device activity, or its host
    tail, whichever ends later. The tail is the host events that end before the first Python frame that starts
    after the last device activity and launches nothing (a ``synchronize`` that waits on an idle device, the
    profiler's exit): those frames, and the enclosing frames they stretch, are teardown. None where there is no
    such frame (the window's host end stands)."""
    device = trace.columns("device_events")
    python = trace.columns("python")
    if not len(device) or not len(python):
        return None
    device_end = float(device.end.max())
    launches = np.sort(launch_table(trace)[1])
    after = python.ts >= device_end
    first_launch = np.searchsorted(launches, python.ts[after], side="left")
    bare = first_launch == launches.size
    bare[~bare] = launches[first_launch[~bare]] > python.end[after][~bare]
    if not bare.any():
        return None
    cut = float(python.ts[after][bare].min())
    tail = [float(ends[ends <= cut].max()) for _, ends in host if (ends <= cut).any()]
    return max([device_end, *tail])


def launch_table(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The correlation ids that runtime calls carry (sorted, distinct) and the host time (µs) of the last call
    of each; cached."""
    cached = trace.__dict__.get("launch_table")
    if cached is None:
        runtimes = trace.columns("runtimes")
        has = np.flatnonzero(runtimes.correlation != ABSENT)[::-1]  # the last call of a correlation wins
        ids, first = np.unique(runtimes.correlation[has], return_index=True)
        cached = trace.__dict__["launch_table"] = (ids, runtimes.ts[has[first]])
    return cached


def device_steps(trace: Trace) -> list[tuple[int, float, float]]:
    """``ProfilerStep#N`` spans moved to the device side (the plugin's rule), tail steps trimmed.

    Without step markers the trace is one step (see :data:`STEP_RULES`).
    """
    steps = list(trace.steps) or _whole_trace_step(trace)
    if not steps:
        return []
    device = trace.columns("device_events")
    has_correlation = device.correlation != ABSENT
    if not has_correlation.any():
        return steps
    # the device activity each correlation launched: its count, first start and last end
    correlations, inverse = np.unique(device.correlation[has_correlation], return_inverse=True)
    launched_count = np.bincount(inverse, minlength=correlations.size)
    first_start = np.full(correlations.size, np.inf)
    np.minimum.at(first_start, inverse, device.ts[has_correlation])
    last_end = np.full(correlations.size, -np.inf)
    np.maximum.at(last_end, inverse, device.end[has_correlation])
    # each launch that launched device activity, in time order (equal starts in the trace's order)
    runtimes = trace.columns("runtimes")
    slot = np.searchsorted(correlations, runtimes.correlation)
    slot = np.minimum(slot, correlations.size - 1)
    launches = np.flatnonzero(correlations[slot] == runtimes.correlation)
    launches = launches[np.argsort(runtimes.ts[launches], kind="stable")]
    launch_ts, launch_end, launch_slot = runtimes.ts[launches], runtimes.end[launches], slot[launches]
    device_span: list[tuple[float, float] | None] = []
    launched = [0] * len(steps)
    matched = np.zeros(correlations.size, dtype=bool)
    r = 0
    for index, (_, start, end) in enumerate(steps):
        low = max(r, int(np.searchsorted(launch_ts, start, side="left")))
        high = max(low, int(np.searchsorted(launch_ts, end, side="left")))
        r = high
        inside = launch_slot[low:high][launch_end[low:high] <= end]
        if inside.size:
            matched[inside] = True
            launched[index] = int(launched_count[inside].sum())
            device_span.append((float(first_start[inside].min()), float(last_end[inside].max())))
        else:
            device_span.append(None)
    if not matched.any():
        return steps
    previous_end = steps[0][1]
    if device_span[0] is not None:
        first_device_start = device_span[0][0]
        rows = np.zeros(len(device), dtype=bool)
        rows[has_correlation] = matched[inverse]
        before = device.end[~rows & (device.end < first_device_start)]
        if before.size:
            previous_end = max(previous_end, float(before.max()))
    adjusted = []
    for (number, start, end), span in zip(steps, device_span, strict=True):
        start = max(previous_end, start)
        end = max(end, span[1]) if span is not None else max(end, start)
        end = max(end, start)
        adjusted.append((number, start, end))
        previous_end = end
    keep = len(adjusted)
    last = keep - 1
    while last >= 0 and launched[last] == 0:
        last -= 1
    if last >= 0:
        keep = last + 1
        if last > 0 and launched[last - 1] * 0.8 > launched[last]:
            keep = last
    return adjusted[:keep] if len(adjusted) > 1 else adjusted


def role_spans(trace: Trace) -> dict[str, spans.Spans]:
    """Each breakdown role's device or host activity, as span sets (cached per trace)."""
    cached = trace.__dict__.get("_role_spans")
    if cached is not None:
        return cached
    kernels, ops, runtimes = trace.columns("kernels"), trace.columns("cpu_ops"), trace.columns("runtimes")
    comm = communication_kernels(trace)
    fetches = ops.named(name for name in trace.names("cpu_ops", DATALOADER_PREFIX) if name.endswith("__next__"))
    # newer torch records the DataLoader as a user annotation
    loading = [a for a in trace.annotations if (name := a.name or "").startswith(DATALOADER_PREFIX)
               and name.endswith("__next__")]
    driver = runtimes.code_mask(runtimes.category, [cat == "cuda_driver" for cat in runtimes.categories])
    result = {
        "kernel": (kernels.ts[~comm], kernels.end[~comm]),
        "memcpy": _spans_of(trace.columns("memcpys")),
        "memset": _spans_of(trace.columns("memsets")),
        "communication": (kernels.ts[comm], kernels.end[comm]),
        # the plugin's runtime role has no driver calls (cuLaunchKernel, cuModuleLoad): they are left to the
        # roles below (CPU exec of the op that made them, or other); they still link launches to kernels
        "runtime": (runtimes.ts[~driver], runtimes.end[~driver]),
        "dataloader": spans.concat((ops.ts[fetches], ops.end[fetches]), spans.of_events(loading)),
        "cpu_exec": (ops.ts[~fetches], ops.end[~fetches]),
    }
    trace.__dict__["_role_spans"] = result
    return result


def _spans_of(columns: Columns) -> spans.Spans:
    return columns.ts, columns.end


def compute_overview(trace: Trace) -> Overview:
    steps = device_steps(trace)
    if not steps:
        return Overview(steps=[], breakdown_us={role: 0.0 for role in ROLES}, step_us=0.0)
    windows = spans.merge((start, end) for _, start, end in steps)
    # A role gets the step time it covers that no earlier role covers: |U_r ∩ steps| - |U_(r-1) ∩ steps|.
    covered_before = 0.0
    so_far = spans.EMPTY
    totals: dict[str, float] = {}
    for role, role_set in role_spans(trace).items():
        so_far = spans.union(spans.concat(so_far, role_set))
        covered = spans.measure(so_far, windows)
        totals[role] = covered - covered_before
        covered_before = covered
    step_total = sum(end - start for _, start, end in steps)
    totals["other"] = spans.total(windows) - covered_before
    count = len(steps)
    overview = Overview(steps=steps, breakdown_us={role: totals[role] / count for role in ROLES},
                        step_us=step_total / count)
    _gpu_metrics(trace, overview, steps[0][1], steps[-1][2])
    return overview


def _gpu_metrics(trace: Trace, overview: Overview, first: float, last: float) -> None:
    """Each device's utilization, SM efficiency and occupancy over ``first`` .. ``last``, less the device time the
    trace does not record (a synchronize's wait on work it does not show: :func:`unrecorded_spans`)."""
    hidden = spans.total([(max(lo, first), min(hi, last)) for lo, hi in unrecorded_spans(trace)
                           if lo < last and hi > first])
    span = last - first - hidden
    if span <= 0:
        return
    kernels = trace.columns("kernels")
    comm = communication_kernels(trace)
    for device in sorted(set(kernels.device[kernels.device != ABSENT].tolist())):
        rows = kernels.device == device
        busy = spans.measure(spans.union((kernels.ts[rows], kernels.end[rows])), [(first, last)])
        overview.gpu_utilization[device] = busy / span
        overview.sm_efficiency[device] = _sm_efficiency(kernels, rows, first, last)
        # collectives run a few blocks by design (NCCL reports occupancy 0): the compute kernels' occupancy
        overview.achieved_occupancy[device] = _occupancy(kernels, rows & ~comm, first, last)


def _sm_efficiency(kernels: Columns, rows: np.ndarray, first: float, last: float) -> float | None:
    """Σ over time of min(Σ blocks-per-SM of running kernels, 1), clipped to the steps, ÷ steps time."""
    rows = np.flatnonzero(rows)
    blocks = kernels.argument("blocks_per_sm")[rows]
    keep = blocks > 0
    if not keep.any():
        return None
    rows, blocks = rows[keep], blocks[keep]
    # each kernel's start (+blocks) and end (-blocks), by time, starts before ends at the same time
    times = np.stack((kernels.ts[rows], kernels.end[rows]), axis=1).ravel()
    kinds = np.tile(np.array([0, 1]), rows.size)
    deltas = np.stack((blocks, -blocks), axis=1).ravel()
    order = np.lexsort((kinds, times))
    times, deltas = times[order], deltas[order]
    level = np.cumsum(deltas)[:-1]  # the level from each edge to the next
    starts, ends = np.maximum(times[:-1], first), np.minimum(times[1:], last)
    counted = (times[1:] > times[:-1]) & (level > 0) & (ends > starts)
    weighted = float(np.sum(np.minimum(level[counted], 1.0) * (ends[counted] - starts[counted])))
    return weighted / (last - first)


def _occupancy(kernels: Columns, rows: np.ndarray, first: float, last: float) -> float | None:
    rows = np.flatnonzero(rows)
    occupancy = kernels.argument("occupancy")[rows]
    starts, ends = np.maximum(kernels.ts[rows], first), np.minimum(kernels.end[rows], last)
    counted = (occupancy >= 0) & (ends > starts)
    time = float(np.sum(ends[counted] - starts[counted]))
    return float(np.sum(occupancy[counted] * (ends[counted] - starts[counted]))) / time if time else None
