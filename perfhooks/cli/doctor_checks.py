"""The checks of ``perfhooks doctor``: what perfhooks needs from this machine, tried once, each with its figure.

Each check returns a :class:`Check` (``pass``, ``warn``, ``fail`` or ``skip``, a one-line detail, and the
measured figure where there is one). Nothing is changed: a window is recorded into a temporary folder, the
allocation history is switched on and back off only when it was off, and nothing synchronizes the device (events
are polled against a deadline, as perfhooks does during a run).
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfhooks.integrations.versions import TESTED, missing_private_apis, untested

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
#: The timing check's kernel: long enough that the host's polling (0.1 ms) and launch are small beside it.
TIMING_KERNEL_MS = 50.0
#: Events and the host's polled clock may differ by this fraction (plus POLL_SLACK_MS) on a known kernel.
TIMING_TOLERANCE = 0.10
POLL_SLACK_MS = 1.0
#: Host cost of one event record and query, µs: above it, the per-step marks cost more than perfhooks states.
EVENT_COST_LIMIT_US = 50.0


@dataclass
class Check:
    name: str
    status: str
    detail: str
    figure: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def machine() -> dict[str, Any]:
    import torch

    return {"python": sys.version.split()[0], "os": platform.platform(), "torch": torch.__version__,
            "cuda_runtime": torch.version.cuda, "hip_runtime": getattr(torch.version, "hip", None)}


# ----------------------------------------------------------------------------- 1. versions
def version_checks() -> list[Check]:
    from importlib import metadata

    checks = [Check("python", PASS if sys.version_info >= (3, 10) else FAIL, f"Python {sys.version.split()[0]} "
                    "(perfhooks needs 3.10 or newer)"),
              Check("os", PASS, platform.platform())]
    for name, (low, high) in TESTED.items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            checks.append(Check(f"version: {name}", SKIP, "not installed"))
            continue
        note = untested(name)
        tested = f"tested {low[0]}.{low[1]} to {high[0]}.{high[1]}"
        checks.append(Check(f"version: {name}", WARN if note else PASS, note or f"{name} {version} ({tested})",
                            {"version": version, "tested": [list(low), list(high)]}))
    return checks


def private_api_checks() -> list[Check]:
    checks = []
    for framework in ("lightning", "transformers", "accelerate", "torch"):
        missing = missing_private_apis(framework)
        if missing is None:
            checks.append(Check(f"internals: {framework}", SKIP, "not installed"))
        elif missing:
            checks.append(Check(f"internals: {framework}", WARN, f"missing: {', '.join(missing)}; perfhooks "
                                "skips what uses them", {"missing": missing}))
        else:
            checks.append(Check(f"internals: {framework}", PASS, "every internal perfhooks reaches is there"))
    return checks


# ----------------------------------------------------------------------------- 2. device timing
def _cuda(device: str | None) -> tuple[Any, str | None]:
    """The device room for ``device`` (default the current CUDA device), or why there is none."""
    import torch

    from perfhooks.device.room import DeviceRoom

    if not torch.cuda.is_available():
        return None, "no CUDA device (torch.cuda.is_available() is False)"
    room = DeviceRoom(device or "cuda")
    return room, None


def _poll_ms(room: Any, event: Any, started_ns: int, deadline_s: float) -> float | None:
    """Host time (ms) from ``started_ns`` until ``event`` completes, polled in a tight loop (a 50 ms check: the
    finish is seen at once); None past the deadline."""
    end = time.monotonic() + deadline_s
    while not room.query(event):
        if time.monotonic() > end:
            return None
    return (time.perf_counter_ns() - started_ns) / 1e6


def timing_checks(device: str | None) -> list[Check]:
    room, why = _cuda(device)
    names = ("device timing", "event cost", "reader timer")
    if room is None:
        return [Check(name, SKIP, why or "") for name in names]
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return [Check(names[0], SKIP, "this torch has no torch.cuda._sleep to time"), _event_cost(room),
                _reader_timer(room, None)]
    try:
        event_ms, host_ms, floor_ms = _time_known_kernel(room, sleep)
    except TimeoutError as error:
        return [Check(names[0], FAIL, str(error)), _event_cost(room), _reader_timer(room, sleep)]
    return [_timing_verdict(event_ms, host_ms, floor_ms), _event_cost(room), _reader_timer(room, sleep)]


def _timing_verdict(event_ms: float, host_ms: float, floor_ms: float | None) -> Check:
    """The device's events against two bounds that a busy host cannot move the wrong way: the host's shortest
    polled reading of the kernel, which a busy host only lengthens (the events may not read longer), and the
    kernel's length at the device's peak clock, which it cannot beat (they may not read shorter)."""
    figure = {"event_ms": round(event_ms, 3), "host_ms": round(host_ms, 3), "ratio": round(event_ms / host_ms, 4),
              "floor_ms": round(floor_ms, 3) if floor_ms is not None else None}
    too_long = event_ms > host_ms * (1 + TIMING_TOLERANCE) + POLL_SLACK_MS
    too_short = floor_ms is not None and event_ms < floor_ms * (1 - TIMING_TOLERANCE) - POLL_SLACK_MS
    floor = (f", and at least {floor_ms:.1f} ms, its length at the device's peak clock" if floor_ms is not None
             else " (no peak clock known to bound it from below)")
    detail = (f"a kernel the host polled as done after {host_ms:.1f} ms (the shortest of its readings; a busy host "
              f"only lengthens them) reads {event_ms:.1f} ms on the device's events; they must read at most that"
              f"{floor}, give or take {TIMING_TOLERANCE:.0%} + {POLL_SLACK_MS:g} ms; no synchronize used")
    if too_long or too_short:
        detail = ("the events read " + ("longer than the host saw the kernel take" if too_long else
                                        "shorter than the kernel can run") + f": {detail}")
    return Check("device timing", FAIL if too_long or too_short else PASS, detail, figure)


def _reader_timer(room: Any, sleep: Any) -> Check:
    """The timing reader's own interval timer (``DeviceRoom.thread_timer``): there, and agreeing with torch's
    ``elapsed_time`` on a short kernel (the clock's own check at a run's first interval, here on a known one)."""
    from perfhooks.device.cuda_extras import TIMER_TOLERANCE_MS

    timer = room.thread_timer()
    if timer is None:
        return Check("reader timer", SKIP, "no CUDA runtime library found mapped into this process: the timing "
                     "reader reads intervals through torch's elapsed_time, which holds the GIL for three runtime "
                     "calls a mark")
    start, end = room.new_event(), room.new_event()
    room.record(start)
    if sleep is not None:
        sleep(100_000)
    room.record(end)
    if not room.wait(end, time.monotonic() + 10.0):
        return Check("reader timer", FAIL, "two events around a short kernel did not complete within 10 s")
    ms, torch_ms = timer(start, end), room.elapsed_ms(start, end)
    figure = {"timer_ms": ms, "torch_ms": round(torch_ms, 6)}
    if ms is None or abs(ms - torch_ms) > TIMER_TOLERANCE_MS:
        return Check("reader timer", WARN, f"cudaEventElapsedTime through ctypes read {ms} ms where torch read "
                     f"{torch_ms:.6f} ms: perfhooks drops it at its first answer and reads through torch (the "
                     "GIL held for three runtime calls a mark)", figure)
    return Check("reader timer", PASS, "the timing reader reads each interval with one cudaEventElapsedTime "
                 f"that releases the GIL ({ms:.4f} ms, as torch's elapsed_time reads it)", figure)


#: Kernels timed by the check: the host's reading of one can only be late (preempted), so the shortest is kept.
TIMING_TRIALS = 5


def _time_known_kernel(room: Any, sleep: Any) -> tuple[float, float, float | None]:
    """Time a ``_sleep`` kernel of at least ``TIMING_KERNEL_MS`` with events and with the host's polling:
    ``(event ms, host ms, floor ms)`` of the trial the host read shortest; ``floor``: its cycles at the device's
    peak clock (None where torch does not say the clock: the cycles are then sized from the host's shortest
    readings)."""
    clock_khz = room.peak_clock_khz()
    if clock_khz is not None:
        cycles = int(TIMING_KERNEL_MS * clock_khz)
    else:
        cycles = 1_000_000
        for _ in range(6):  # grow the kernel until it is long enough to measure its rate
            host = min(_kernel(room, sleep, cycles)[1] for _ in range(2))
            if host >= 5.0:
                break
            cycles *= 10
        cycles = int(cycles * TIMING_KERNEL_MS / max(host, 1e-3))
    event_ms, host_ms = min((_kernel(room, sleep, cycles) for _ in range(TIMING_TRIALS)), key=lambda pair: pair[1])
    return event_ms, host_ms, cycles / clock_khz if clock_khz is not None else None


def _kernel(room: Any, sleep: Any, cycles: int) -> tuple[float, float]:
    start, end = room.new_event(), room.new_event()
    room.drained(time.monotonic() + 10.0)  # an idle stream: the kernel starts at once
    room.record(start)
    started = time.perf_counter_ns()
    sleep(cycles)
    room.record(end)
    host_ms = _poll_ms(room, end, started, 10.0)
    if host_ms is None:
        raise TimeoutError("the timing kernel did not finish within 10 s")
    return room.elapsed_ms(start, end), host_ms


def _event_cost(room: Any, pairs: int = 1000) -> Check:
    event = room.new_event()
    started = time.perf_counter_ns()
    for _ in range(pairs):
        room.record(event)
        room.query(event)
    cost_us = (time.perf_counter_ns() - started) / 1e3 / pairs
    return Check("event cost", PASS if cost_us <= EVENT_COST_LIMIT_US else WARN,
                 f"{cost_us:.1f} µs of host time per event record and query (limit {EVENT_COST_LIMIT_US:g} µs; a "
                 "step takes about 9)", {"us_per_mark": round(cost_us, 2)})


# ----------------------------------------------------------------------------- 3. NVTX
def nvtx_check() -> Check:
    try:
        import nvtx
    except ImportError:
        return Check("nvtx", WARN, "the nvtx package is not importable (pip install nvtx): no NVTX ranges for "
                     "Nsight Systems; everything else works")
    domain = nvtx.get_domain("perfhooks-doctor")
    attributes = domain.get_event_attributes(message="doctor")
    domain.push_range(attributes)
    domain.pop_range()
    under_nsys = bool(os.environ.get("NSYS_PROFILING_SESSION_ID")) or "nsys" in os.environ.get("LD_PRELOAD", "")
    attached = getattr(domain, "handle", None) is not None
    detail = ("ranges push and pop; " + ("a tool is attached (Nsight Systems captures them)" if attached else
              "no NVTX tool attached: ranges cost an attribute lookup") + (" ; running under nsys" if under_nsys
                                                                           else ""))
    return Check("nvtx", PASS, detail, {"tool_attached": attached, "under_nsys": under_nsys})


def cupti_check(cuda: bool, records_cuda: bool, environ: MutableMapping[str, str] = os.environ) -> Check:
    """Whether torch can record CUDA activity (CUPTI), and whether Kineto lets CUPTI go after each window."""
    from perfhooks.device.cupti_teardown import VARIABLE, detaches_after_windows

    if not cuda:
        return Check("cupti", SKIP, "no CUDA device")
    if not records_cuda:
        return Check("cupti", WARN, "this torch cannot record CUDA activity (no CUPTI): windows record host "
                     "activity only")
    value = environ.get(VARIABLE)
    detached = detaches_after_windows(environ)
    figure = {"teardown_cupti": value, "detached_after_windows": detached}
    if detached:
        return Check("cupti", PASS, "torch's profiler can record CUDA activity (CUPTI), and Kineto detaches it after "
                     f"each window ({VARIABLE}=1{'' if value else ', which perfhooks sets while a run lasts'})",
                     figure)
    if value is not None:
        why, fix = f"{VARIABLE}={value!r} is set", "unset it, or set it to 1 where the run captures no CUDA graphs"
    else:
        why = "CUDA older than 12.6, or torch keeps CUPTI for CUDA graphs here"
        fix = f"where the run captures no CUDA graphs, set {VARIABLE}=1"
    return Check("cupti", WARN, "torch's profiler can record CUDA activity (CUPTI), but Kineto leaves it attached "
                 f"after a window, which slows every later step ({why}): {fix}", figure)


# ----------------------------------------------------------------------------- 4. the profiler
def profiler_check(device: str | None) -> list[Check]:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from perfhooks.analysis.trace import load_trace

    cuda = torch.cuda.is_available()
    supported = torch.profiler.supported_activities()
    cupti = cupti_check(cuda, ProfilerActivity.CUDA in supported)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda and ProfilerActivity.CUDA in supported
                                           else [])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "doctor.pt.trace.json"
        a, b = torch.randn(128, 128), torch.randn(128, 128)
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as window:
            for _ in range(5):
                (a @ b).sum()
                window.step()
        if not path.exists():
            return [Check("profiler", FAIL, "the 3-step window wrote no trace"), cupti]
        trace = load_trace(path)
        steps = len(trace.steps)
        matmuls = sum(1 for op in trace.cpu_ops if "mm" in (op.name or ""))
    good = steps >= 3 and matmuls >= 3
    return [Check("profiler", PASS if good else FAIL, f"a 3-step window recorded {steps} steps and {matmuls} matmul "
                  "operators; perfhooks' analysis read its trace", {"steps": steps, "matmuls": matmuls}), cupti]


# ----------------------------------------------------------------------------- 5. memory
def memory_checks(device: str | None) -> list[Check]:
    room, why = _cuda(device)
    names = ("memory stats", "memory history", "memory snapshot", "oom observer")
    if room is None:
        return [Check(name, SKIP, why or "") for name in names]
    from perfhooks.device import cuda_extras

    checks = []
    figures = room.memory()
    free, total = room.memory_info()
    checks.append(Check("memory stats", PASS, f"allocated {figures.allocated_bytes} B, reserved "
                        f"{figures.reserved_bytes} B; the device has {free} of {total} B free",
                        {"free_bytes": free, "total_bytes": total}))
    if not cuda_extras.history_supported():
        checks.append(Check("memory history", FAIL, "this torch has no torch.cuda.memory._record_memory_history: "
                            "near-limit captures have no stacks"))
        checks.append(Check("memory snapshot", SKIP, "no allocation history to snapshot"))
    else:
        checks.extend(_history_and_snapshot(cuda_extras))
    import torch

    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    checks.append(Check("oom observer", PASS if callable(attach) else FAIL,
                        "the allocator's OOM observer can be attached" if callable(attach) else
                        "this torch has no _cuda_attach_out_of_memory_observer: OOM dumps lack the allocator's "
                        "own account"))
    return checks


def _history_and_snapshot(cuda_extras: Any) -> list[Check]:
    import pickle

    was_on = cuda_extras.history_enabled()
    try:
        if not was_on:
            cuda_extras.start_history(1000)
        on = cuda_extras.history_enabled()
        started = time.perf_counter_ns()
        snapshot = cuda_extras.snapshot()
        taken_ms = (time.perf_counter_ns() - started) / 1e6
        size = len(pickle.dumps(snapshot, protocol=4))
    except Exception as error:
        return [Check("memory history", FAIL, f"{type(error).__name__}: {error}"),
                Check("memory snapshot", SKIP, "no history")]
    finally:
        if not was_on:
            cuda_extras.stop_history()
    entries = sum(len(trace) for trace in snapshot.get("device_traces", []))
    return [Check("memory history", PASS if on is not False else FAIL, "recording switched on and off" + (
                  "" if not was_on else " (it was already on: left as it was)")),
            Check("memory snapshot", PASS, f"{entries} history entries, {size} B pickled, taken in {taken_ms:.1f} ms",
                  {"entries": entries, "bytes": size, "ms": round(taken_ms, 2)})]


# ----------------------------------------------------------------------------- 6. distributed
def distributed_check() -> Check:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return Check("distributed store", SKIP, "no process group (torch.distributed not initialised)")
    from perfhooks.distributed import store as rank_store

    try:
        store = rank_store.default_store()
        key = f"perfhooks-doctor-{os.getpid()}"
        store.set(key, b"ok")
        good = store.get(key) == b"ok"
    except Exception as error:
        return Check("distributed store", FAIL, f"{type(error).__name__}: {error}")
    return Check("distributed store", PASS if good else FAIL, "perfhooks' keys round-trip through the process "
                 "group's store")


def run_checks(device: str | None = None) -> list[Check]:
    """Every check, in the order the table shows them."""
    checks = version_checks() + private_api_checks() + timing_checks(device) + [nvtx_check()]
    checks += profiler_check(device) + memory_checks(device) + [distributed_check()]
    return checks
