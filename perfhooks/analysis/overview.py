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

import bisect
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from perfhooks.analysis import ranges, spans
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
    ids = set()
    for kind in ("cpu_ops", "annotations"):
        collectives = trace.names(kind, COMMUNICATION_OPS)
        for event in getattr(trace, kind):
            if event.name in collectives:
                ext = event.external_id
                if ext is not None:
                    ids.add(ext)
    trace.__dict__["_communication_ids"] = ids
    return ids


def is_communication_kernel(kernel: Event, comm_ids: set[Any]) -> bool:
    return _communication_name(kernel.name or "") or (bool(comm_ids) and kernel.external_id in comm_ids)


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


def _whole_trace_step(trace: Trace) -> list[tuple[int, float, float]]:
    """One step over the host events (the device side is added by the launches, as for any step), or over
    the device events when the trace has no host side."""
    rule = step_rule(trace)
    if rule == "host_window":
        # a synchronization at either edge (the profiler's own at stop: torch.autograd.profiler's __exit__ calls
        # the device's synchronize()) waits for the window's work: it is not work of its own
        runtimes = [r for r in trace.runtimes if not (r.name or "").startswith(SYNC_RUNTIME)]
        host = [events for events in (trace.cpu_ops, trace.python, trace.annotations, runtimes) if events]
        if not host:
            host = [trace.runtimes]
        # the profiler's own stop (and what runs inside it: a synchronize, the trace's collection) is teardown,
        # not the window's work: recorded with stacks it can outlast the last kernel by most of a second
        names = {name for name in {e.name for e in trace.python} if name and _is_profiler_teardown(name)}
        teardown = [(e.ts, e.ts + e.dur) for e in trace.python if e.name in names] if names else []
        if teardown:
            first = min(lo for lo, _ in teardown)
            kept = [[e for e in events if e.ts < first
                     or not any(lo <= e.ts and e.ts + e.dur <= hi for lo, hi in teardown)] for events in host]
            host = [events for events in kept if events] or host
        start = activity_start(trace, runtimes) or min(e.ts for events in host for e in events)
        return [(0, start, _teardown_cut(trace, host) or max(e.ts + e.dur for events in host for e in events))]
    if rule == "device_only":
        device = trace.device_events
        return [(0, device[0].ts, max(e.ts + e.dur for e in device))]
    return []


def activity_start(trace: Trace, runtimes: list[Event] | None = None) -> float | None:
    """Where a step-less window's activity starts: its first operator or runtime call (a synchronization left
    out; its first device activity where it has neither). Python frames and annotations before it (the
    profiler's start, a script's idle lead-in) are the capture's lead-in, not the program's work. None where
    there is none of those."""
    if runtimes is None:
        runtimes = [r for r in trace.runtimes if not (r.name or "").startswith(SYNC_RUNTIME)]
    firsts = [min(e.ts for e in events) for events in (trace.cpu_ops, runtimes) if events]
    if not firsts and trace.device_events:  # device work that starts before any host call was queued before it
        firsts.append(trace.device_events[0].ts)
    return min(firsts) if firsts else None


def lead_in_us(trace: Trace) -> float:
    """µs between a step-less window's first host event and the start of its activity (0 with step markers)."""
    if step_rule(trace) != "host_window":
        return 0.0
    start = activity_start(trace)
    host = [min(e.ts for e in events) for events in (trace.cpu_ops, trace.python, trace.annotations, trace.runtimes)
            if events]
    return max(0.0, start - min(host)) if start is not None and host else 0.0


def _teardown_cut(trace: Trace, host: list[list[Event]]) -> float | None:
    """The end of a step-less window whose host outlives its device work: its last device activity, or its host
    tail, whichever ends later. The tail is the host events that end before the first Python frame that starts
    after the last device activity and launches nothing (a ``synchronize`` that waits on an idle device, the
    profiler's exit): those frames, and the enclosing frames they stretch, are teardown. None where there is no
    such frame (the window's host end stands)."""
    device = trace.device_events
    if not device or not trace.python:
        return None
    device_end = max(e.ts + e.dur for e in device)
    launches = sorted(trace.launch_ts.values())
    cut = None
    for frame in trace.python:
        if frame.ts >= device_end and (cut is None or frame.ts < cut):
            first_launch = bisect.bisect_left(launches, frame.ts)
            if first_launch == len(launches) or launches[first_launch] > frame.ts + frame.dur:
                cut = frame.ts
    if cut is None:
        return None
    tail = [e.ts + e.dur for events in host for e in events if e.ts + e.dur <= cut]
    return max([device_end, *tail])


def device_steps(trace: Trace) -> list[tuple[int, float, float]]:
    """``ProfilerStep#N`` spans moved to the device side (the plugin's rule), tail steps trimmed.

    Without step markers the trace is one step (see :data:`STEP_RULES`).
    """
    steps = list(trace.steps) or _whole_trace_step(trace)
    if not steps:
        return []
    devices_by_correlation: dict[Any, list[Event]] = {}
    for event in trace.device_events:
        correlation = event.correlation
        if correlation is not None:
            devices_by_correlation.setdefault(correlation, []).append(event)
    if not devices_by_correlation:
        return steps
    # (ts, end, the devices it launched) of each launch, in time order: read once, not once a step
    launches = sorted(((r.ts, r.ts + r.dur, devices_by_correlation[c]) for r in trace.runtimes
                       if (c := r.correlation) in devices_by_correlation), key=lambda launch: launch[0])
    device_span: list[tuple[float, float] | None] = []
    launched = [0] * len(steps)
    matched: set[int] = set()
    count = len(launches)
    r = 0
    for index, (_, start, end) in enumerate(steps):
        low, high = float("inf"), float("-inf")
        while r < count and launches[r][0] < start:
            r += 1
        k = r
        while k < count and launches[k][0] < end:
            _, launch_end, devices = launches[k]
            if launch_end <= end:
                for device in devices:
                    ts = device.ts
                    if ts < low:
                        low = ts
                    if ts + device.dur > high:
                        high = ts + device.dur
                    matched.add(id(device))
                launched[index] += len(devices)
            k += 1
        r = k
        device_span.append((low, high) if launched[index] else None)
    if not matched:
        return steps
    previous_end = steps[0][1]
    if device_span[0] is not None:
        first_device_start = device_span[0][0]
        for event in trace.device_events:
            event_end = event.ts + event.dur
            if id(event) not in matched and event_end < first_device_start:
                previous_end = max(previous_end, event_end)
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
    comm_ids = communication_ids(trace)
    compute, comm = [], []
    for kernel in trace.kernels:
        (comm if is_communication_kernel(kernel, comm_ids) else compute).append(kernel)
    dataloader, cpu_exec = [], []
    fetches = {name for name in trace.names("cpu_ops", DATALOADER_PREFIX) if name.endswith("__next__")}
    for op in trace.cpu_ops:
        (dataloader if op.name in fetches else cpu_exec).append(op)
    for annotation in trace.annotations:  # newer torch records the DataLoader as a user annotation
        name = annotation.name or ""
        if name.startswith(DATALOADER_PREFIX) and name.endswith("__next__"):
            dataloader.append(annotation)
    result = {
        "kernel": spans.of_events(compute),
        "memcpy": spans.of_events(trace.memcpys),
        "memset": spans.of_events(trace.memsets),
        "communication": spans.of_events(comm),
        # the plugin's runtime role has no driver calls (cuLaunchKernel, cuModuleLoad): they are left to the
        # roles below (CPU exec of the op that made them, or other); they still link launches to kernels
        "runtime": spans.of_events([r for r in trace.runtimes if r.cat != "cuda_driver"]),
        "dataloader": spans.of_events(dataloader),
        "cpu_exec": spans.of_events(cpu_exec),
    }
    trace.__dict__["_role_spans"] = result
    return result


def compute_overview(trace: Trace) -> Overview:
    steps = device_steps(trace)
    if not steps:
        return Overview(steps=[], breakdown_us={role: 0.0 for role in ROLES}, step_us=0.0)
    windows = ranges.merge((start, end) for _, start, end in steps)
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
    totals["other"] = ranges.total(windows) - covered_before
    count = len(steps)
    overview = Overview(steps=steps, breakdown_us={role: totals[role] / count for role in ROLES},
                        step_us=step_total / count)
    _gpu_metrics(trace, overview, steps[0][1], steps[-1][2])
    return overview


def _gpu_metrics(trace: Trace, overview: Overview, first: float, last: float) -> None:
    """Each device's utilization, SM efficiency and occupancy over ``first`` .. ``last``, less the device time the
    trace does not record (a synchronize's wait on work it does not show: :func:`unrecorded_spans`)."""
    hidden = ranges.total([(max(lo, first), min(hi, last)) for lo, hi in unrecorded_spans(trace)
                           if lo < last and hi > first])
    span = last - first - hidden
    if span <= 0:
        return
    by_device: dict[int, list[Event]] = {}
    for kernel in trace.kernels:
        device = kernel.device
        if isinstance(device, int):
            by_device.setdefault(device, []).append(kernel)
    comm_ids = communication_ids(trace)
    for device, kernels in sorted(by_device.items()):
        busy = spans.measure(spans.union(spans.of_events(kernels)), [(first, last)])
        overview.gpu_utilization[device] = busy / span
        overview.sm_efficiency[device] = _sm_efficiency(kernels, first, last)
        # collectives run a few blocks by design (NCCL reports occupancy 0): the compute kernels' occupancy
        compute = [kernel for kernel in kernels if not is_communication_kernel(kernel, comm_ids)]
        overview.achieved_occupancy[device] = _occupancy(compute, first, last)


def _sm_efficiency(kernels: list[Event], first: float, last: float) -> float | None:
    """Σ over time of min(Σ blocks-per-SM of running kernels, 1), clipped to the steps, ÷ steps time."""
    edges: list[tuple[float, int, float]] = []
    for kernel in kernels:
        blocks = kernel.a.blocks_per_sm
        if isinstance(blocks, (int, float)) and blocks > 0:
            edges.append((kernel.ts, 0, blocks))
            edges.append((kernel.ts + kernel.dur, 1, -blocks))
    if not edges:
        return None
    edges.sort(key=lambda edge: (edge[0], edge[1]))
    weighted = 0.0
    level = 0.0
    previous = edges[0][0]
    for time, _, delta in edges:
        if time > previous and level > 0:
            start, end = max(previous, first), min(time, last)
            if end > start:
                weighted += min(level, 1.0) * (end - start)
        previous = time
        level += delta
    return weighted / (last - first)


def _occupancy(kernels: list[Event], first: float, last: float) -> float | None:
    weighted = time = 0.0
    for kernel in kernels:
        occupancy = kernel.a.occupancy
        if isinstance(occupancy, (int, float)) and occupancy >= 0:
            start, end = max(kernel.ts, first), min(kernel.ts + kernel.dur, last)
            if end > start:
                weighted += occupancy * (end - start)
                time += end - start
    return weighted / time if time else None
