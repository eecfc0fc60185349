"""Rules on a profiler window's metrics (:func:`perfhooks.offline.analyze.trace_metrics`)."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from perfhooks.analysis.steady import MOSTLY_NOT_STEADY
from perfhooks.rules.live import loader_fix
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import TITLES, Diagnosis, make, pct

#: Speed-up assumed for Tensor-Core-eligible FP32 work under bf16 autocast (conservative; up to ~8x on A100).
BF16_SPEEDUP = 3.0

#: ... and for TF32 work, which already runs on Tensor Cores.
TF32_TO_BF16_SPEEDUP = 1.5

#: GPUs with FP16 Tensor Cores but no BF16 (Volta, Turing): mixed precision there is FP16 with a GradScaler.
_FP16_ONLY_GPU = re.compile(r"V100|Titan V|\bT4\b|RTX 20\d0|Quadro RTX|TITAN RTX|Tesla T", re.IGNORECASE)


def _autocast_fix(metrics: dict[str, Any]) -> str:
    names = [str(device.get("name") or "") for device in (metrics.get("devices") or {}).values()]
    if names and all(_FP16_ONLY_GPU.search(name) for name in names):
        return (f"The {names[0]} has FP16 Tensor Cores but no BF16: run the forward pass under FP16 autocast with "
                "a GradScaler: with torch.autocast(\"cuda\", dtype=torch.float16): loss = model(batch); then "
                "scaler.scale(loss).backward() (Lightning: Trainer(precision=\"16-mixed\"); HF: "
                "TrainingArguments(fp16=True)).")
    return ("Run the forward pass under autocast: with torch.autocast(\"cuda\", dtype=torch.bfloat16): "
            "loss = model(batch) (Lightning: Trainer(precision=\"bf16-mixed\"); HF: TrainingArguments(bf16=True)).")


def diagnose_trace(metrics: dict[str, Any], t: Thresholds = Thresholds()) -> list[dict[str, Any]]:
    """Rules that read one trace's metrics (see :func:`perfhooks.offline.analyze.trace_metrics`)."""
    out: list[dict[str, Any]] = []
    step_us = metrics.get("step_us") or 0.0
    breakdown = metrics.get("breakdown") or {}
    if step_us <= 0:  # no steps, or steps of no duration: no rule has a premise
        return out
    # the steady-state rules are judged on the steps less one-time start-up work and graph captures
    steady = metrics.get("steady") or {}
    step_us = steady.get("step_us") or step_us
    out.extend(_not_steady_state(metrics, steady, t))
    if steady.get("mostly_not_steady"):  # what is left is too little, and too likely more of the same, to judge
        out.append(_window_not_steady(metrics, steady))
        compiling = _compiling_in_window(_Steady(metrics, step_us, breakdown, None, t))
        return out + ([compiling] if compiling else [])

    def share(role: str) -> float:
        return breakdown.get(role, 0.0) / step_us if step_us else 0.0

    dataloader = share("dataloader")
    if dataloader >= t.dataloader_share:
        out.append(make(
            "dataloader_bound", "critical" if dataloader >= t.dataloader_critical_share else "warning",
            TITLES["dataloader_bound"],
            f"DataLoader takes {pct(dataloader)} of the step ({breakdown['dataloader'] / 1e3:.1f} ms of "
            f"{step_us / 1e3:.1f} ms); threshold {pct(t.dataloader_share)}",
            dataloader,
            "Load batches in worker processes and keep them ahead of the GPU (no more workers than the CPUs the "
            "process may use, less one for training): " + loader_fix(None, bool(metrics.get("devices")), None),
            dataloader_share=dataloader))
    utilization = steady["gpu_utilization"] if "gpu_utilization" in steady else metrics.get("gpu_utilization")
    if metrics.get("queueing"):  # the device was busy; the time before its first kernel was queueing, not idle
        utilization = None
    if graph_warm_up(metrics, steady, t):  # a graph warm-up: graph_capture_in_window says it, with the rest's figure
        utilization = None
    window_us = step_us * max(metrics.get("steps") or 1, 1)
    if (metrics.get("sync_tail") or {}).get("tail_us", 0.0) >= 0.5 * window_us:
        utilization = None  # most of the window is the host's after a synchronize: host_after_sync says the burst's
    # no kernel at all inside the steps is more likely device activity that was not recorded than an idle GPU
    if utilization is not None and 0 < utilization < t.gpu_utilization:
        out.append(make(
            "low_gpu_utilization", "critical" if utilization < t.gpu_utilization / 2 else "warning",
            "The GPU is idle for much of each step",
            f"GPU utilization {pct(utilization)} (kernels running ÷ {_utilization_basis(metrics, steady)}); "
            f"threshold {pct(t.gpu_utilization)}",
            1 - utilization,
            "Find what the GPU waits for in the idle breakdown and the diagnoses above; then raise the work per "
            "step (a larger batch) so launch and host overheads are amortized.",
            gpu_utilization=utilization, step_ms=round(step_us / 1e3, 3)))
    launch = metrics.get("launch") or {}
    idle = metrics.get("idle") or {}
    temporal = metrics.get("temporal") or {}
    launch_heavy = launch.get("short_kernel_share", 0.0) >= t.short_kernel_share
    # GPU idle time spent waiting on the host, less what the DataLoader already explains, and no more than the
    # time the host spent in launch calls: idle time behind other host work (Python, allocation) is not launch cost
    # it fires on that; the gain is the ceiling: CUDA graphs remove all of the host's gaps between launches
    launch_calls = launch.get("launch_call_share")
    host_wait = max(0.0, temporal.get("idle", 0.0) * idle.get("host_wait", 0.0) - dataloader)
    in_launches = min(host_wait, launch_calls) if launch_calls is not None else host_wait
    if (launch_heavy and idle.get("host_wait", 0.0) >= t.host_wait_share and in_launches >= 0.05
            and utilization is not None and utilization < 0.8):
        out.append(make(
            "launch_bound", "warning", "Kernel launches cannot keep the GPU fed",
            f"{pct(launch['short_kernel_share'])} of kernels run < 10 µs ({launch['kernels_per_step']:.0f} per step), "
            f"{pct(idle['host_wait'])} of GPU idle time waits on the host, and the host spends "
            f"{pct(launch_calls or 0.0)} of the step in launch calls; the GPU waits on the host "
            f"{pct(host_wait)} of the step beyond the DataLoader, which CUDA graphs remove at most; thresholds "
            f"{pct(t.short_kernel_share)} and {pct(t.host_wait_share)}",
            host_wait,
            "Cut per-kernel launch cost: model = torch.compile(model, mode=\"reduce-overhead\") (CUDA graphs), "
            "fuse small ops, or raise the batch size.",
            short_kernel_share=launch["short_kernel_share"], host_wait_share=idle["host_wait"],
            launch_call_share=launch_calls, host_wait_share_of_step=host_wait))
    elif (not launch_heavy and utilization is not None and utilization < 0.8 and host_wait >= t.host_bound_share
          and metrics.get("step_rule", "profiler_steps") == "profiler_steps"):  # a window's idle edges are not steps
        out.append(_host_bound(metrics, step_us, breakdown, utilization, host_wait, launch, t))
    out.extend(_steady_state_rules(metrics, step_us, breakdown, utilization, t))
    return out


def _utilization_basis(metrics: dict[str, Any], steady: dict[str, Any]) -> str:
    """What utilization was measured over, in words: the steps, or a step-less window's activity (its lead-in
    not counted), less what the steady state leaves out and the device time the trace does not record."""
    basis = ("step time" if metrics.get("step_rule", "profiler_steps") == "profiler_steps" else
             "the time of the window's activity, which has no step markers"
             + (f"; the {metrics['lead_in_us'] / 1e3:.1f} ms before its first operator are the capture's lead-in, "
                "not counted" if metrics.get("lead_in_us", 0.0) >= 1_000.0 else ""))
    if steady:
        basis += ", less one-time start-up work and graph captures"
    unrecorded = (metrics.get("unrecorded") or {}).get("unrecorded_us")
    if unrecorded:
        basis += f", less {unrecorded / 1e3:.1f} ms of device work the trace does not record"
    tail = (metrics.get("sync_tail") or {}).get("tail_us")
    if tail:
        basis += f", less {tail / 1e3:.1f} ms the host stayed in a synchronize after its device call returned"
    return basis


def _host_bound(metrics: dict[str, Any], step_us: float, breakdown: dict[str, Any], utilization: float,
                host_wait: float, launch: dict[str, Any], t: Thresholds) -> Diagnosis:
    """The GPU waits on the host, and its kernels are not tiny (``launch_bound`` is the tiny-kernel case): the
    host's own work per step (Python, the framework, the operators' dispatch) is longer than the kernels'."""
    kernel_ms = utilization * step_us / 1e3
    host_ms = sum(breakdown.get(role, 0.0) for role in ("cpu_exec", "runtime", "other")) / 1e3
    calls = launch.get("launch_call_share")
    return make(
        "host_bound", "warning", TITLES["host_bound"],
        f"the GPU waits on the host {pct(host_wait)} of the step beyond the DataLoader "
        f"({host_wait * step_us / 1e3:.1f} ms of {step_us / 1e3:.1f} ms); the kernels take {kernel_ms:.1f} ms a "
        f"step and the host's operators, "
        f"runtime calls and other work {host_ms:.1f} ms; {launch.get('kernels_per_step', 0):.0f} launches a step, of "
        f"which only {pct(launch.get('short_kernel_share', 0.0))} run < 10 µs (not a launch-bound step)"
        + (f", and launch calls take {pct(calls)} of the step" if calls is not None else "")
        + f"; threshold {pct(t.host_bound_share)}",
        host_wait,
        "Cut the host's work per step: model = torch.compile(model) (mode=\"reduce-overhead\" adds CUDA graphs, which "
        "replay the step's launches at once); a larger batch, so each launch does more work; fewer small ops (a "
        "fused or foreach optimizer, no per-step .item() or Python loops over tensors).",
        host_wait_share_of_step=host_wait, kernel_ms_per_step=round(kernel_ms, 3), host_ms_per_step=round(host_ms, 3),
        kernels_per_step=launch.get("kernels_per_step"), step_ms=round(step_us / 1e3, 3),
        gpu_utilization=utilization)


def _window_not_steady(metrics: dict[str, Any], steady: dict[str, Any]) -> Diagnosis:
    window_us = (metrics.get("step_us") or 0.0) * max(metrics.get("steps") or 1, 1)
    parts = [f"{label} {steady[key] / 1e3:.1f} ms" for key, label in
             (("capture_us", "graph capture"), ("setup_us", "graph instantiation and upload, module loads"),
              ("compile_us", "compilation"),
              ("first_call_us", "first-call work (algorithm search, lazy module loads)")) if steady.get(key)]
    return make(
        "window_not_steady", "info", "Most of the window is start-up, capture or compilation: nothing steady judged",
        f"{steady['excluded_us'] / 1e3:.1f} ms of the {window_us / 1e3:.1f} ms window, "
        f"{pct(steady['excluded_share'])}, is one-time work (start-up calls"
        + "".join(f", {part}" for part in parts) + "); the rest is too little, and too likely more first-call work "
        "the trace does not name (Python, imports), to judge utilization, launches, syncs or kernels as steady "
        f"state; threshold {pct(MOSTLY_NOT_STEADY)}",
        0.0,
        "Profile steady-state steps: a larger perfhooks.Schedule(skip_first=...) (torch.profiler.schedule(wait=..., "
        "warmup=...)), or start the profiler after the first iterations (after warm-up and compilation).",
        excluded_share=steady["excluded_share"])


#: Device time the trace does not record is said (``unrecorded_device_work``) from this share 0..1 of the window;
#: below it, it is only left out of utilization.
UNRECORDED_SAID_SHARE = 0.05


def _unrecorded(unrecorded: dict[str, Any], window_us: float) -> Diagnosis:
    """``unrecorded_device_work``: synchronizes that waited far longer than the device work the trace records in
    them; that time is the device's, unrecorded, and is not counted as idle."""
    share = unrecorded["unrecorded_us"] / window_us if window_us else 0.0
    return make(
        "unrecorded_device_work", "info", "The host waited on device work this trace does not record",
        f"the host waited {unrecorded['wait_us'] / 1e3:.1f} ms in {unrecorded['syncs']} device synchronize(s) while "
        f"the trace records {unrecorded['device_us'] / 1e3:.1f} ms of device work in them: the device ran work this "
        "trace does not show (graph replays, another process) or its clock is offset. The "
        f"{unrecorded['unrecorded_us'] / 1e3:.1f} ms after the last recorded work in each ({pct(share)} of the "
        "window) are unrecorded, not idle: utilization is judged without them",
        0.0,
        "Nothing to fix from this trace: to see that work, profile the process that runs it (or record the graphs' "
        "replays: a window after the capture), and check that the device's clock and the host's agree.",
        unrecorded_us=unrecorded["unrecorded_us"], unrecorded_share=round(share, 4), syncs=unrecorded["syncs"])


def _not_steady_state(metrics: dict[str, Any], steady: dict[str, Any], t: Thresholds) -> list[dict[str, Any]]:
    """What in the window is not the steady state, said as information: start-up work, graph captures, device
    work queued behind work the trace did not record."""
    out: list[dict[str, Any]] = []
    startup = metrics.get("startup") or {}
    if (startup.get("share") or 0.0) >= t.startup_share:
        names = ", ".join(f"{name} {us / 1e3:.1f} ms" for name, us in startup["by_name"].items())
        out.append(make(
            "startup_in_window", "info", "One-time start-up work fell in the captured window",
            f"{startup['calls']} runtime call(s) took {startup['time_us'] / 1e3:.1f} ms, {pct(startup['share'])} of "
            f"the window ({names}): modules loaded at a kernel's first launch, streams, events and allocator set "
            f"up; none of it recurs in the steady state, and the window's other figures are diluted by it; "
            f"threshold {pct(t.startup_share)}",
            0.0,
            "Profile after warm-up: perfhooks.Schedule(skip_first=...) (torch.profiler.schedule(wait=..., "
            "warmup=...)) so that the window holds steady-state steps only.",
            startup_share=startup["share"]))
    window_us = (metrics.get("step_us") or 0.0) * max(metrics.get("steps") or 1, 1)
    capture_share = steady.get("capture_us", 0.0) / window_us if window_us else 0.0
    if capture_share >= t.startup_share:
        rest = steady.get("gpu_utilization")
        judged = ("utilization is judged on the rest" if rest is not None and not graph_warm_up(metrics, steady, t)
                  else f"the rest runs at {pct(rest)} utilization, a warm-up's, not judged" if rest is not None
                  else "too little is left to judge utilization")
        out.append(make(
            "graph_capture_in_window", "info", "The window holds CUDA-graph capture, not steady-state steps",
            f"{steady['captures']} stream capture(s) (cudaStreamBeginCapture … EndCapture) take "
            f"{steady['capture_us'] / 1e3:.1f} ms, {pct(capture_share)} of the window, and graph set-up "
            f"(instantiation, upload, allocations) {steady.get('setup_us', 0.0) / 1e3:.1f} ms: launches inside a "
            f"capture are recorded into a graph and run nothing, so the device looks idle; "
            f"{pct(steady.get('graph_runtime_share', 0.0))} of the runtime calls' time is graph capture and set-up; "
            f"{judged}; threshold {pct(t.startup_share)}",
            0.0,
            "Profile after the graphs are captured (a larger Schedule(skip_first=...), or start the profiler after "
            "the model's warm-up), so that the window holds graph replays.",
            capture_share=capture_share, captures=steady["captures"]))
    unrecorded = metrics.get("unrecorded") or {}
    if window_us and unrecorded.get("unrecorded_us", 0.0) >= UNRECORDED_SAID_SHARE * window_us:
        out.append(_unrecorded(unrecorded, window_us))
    tail = metrics.get("sync_tail") or {}
    if window_us and tail.get("tail_us", 0.0) >= UNRECORDED_SAID_SHARE * window_us:
        share = tail["tail_us"] / window_us
        out.append(make(
            "host_after_sync", "info", "The host stayed in a synchronize after the device was done",
            f"the host stayed {tail['tail_us'] / 1e3:.1f} ms inside {tail['frames']} synchronize frame(s) after their "
            f"device call returned ({pct(share)} of the window), with no call, operator or device work recorded "
            "there: that time is the host's, and this trace cannot say what it was; it is not device work, and "
            "utilization is judged without it"
            + (f"; the device's recorded work is {tail['device_us'] / 1e3:.2f} ms, {pct(tail['device_busy_share'])} "
               f"busy over its {tail['device_span_us'] / 1e3:.2f} ms"
               + ("" if tail["tail_us"] < 0.5 * window_us else ", too little of the window to judge its "
                  "utilization") if tail.get("device_span_us") else ""),
            0.0, "Record the window with with_stack=True (perfhooks.Schedule / torch.profiler) to see what the host "
            "ran there, or time the synchronize's callers; a larger batch does not fill this time.",
            tail_us=tail["tail_us"], tail_share=round(share, 4), frames=tail["frames"]))
    queueing = metrics.get("queueing") or {}
    if queueing:
        out.append(make(
            "device_queued", "info", "Kernels queued behind work the trace did not record",
            f"the device ran {pct(queueing['busy_share'])} busy from its first kernel to its last; the "
            f"{queueing['lead_us'] / 1e3:.1f} ms before its first kernel is most of the window's idle time, and "
            f"kernels started a median {queueing['median_launch_to_start_us'] / 1e3:.1f} ms after their launch: "
            "that time is queueing behind work launched before the window (or a clock offset), not an idle GPU; "
            "utilization is not judged",
            0.0,
            "Synchronize before the window opens (torch.cuda.synchronize() before the profiler starts), so that "
            "the window holds the device work its own launches made.",
            busy_share=queueing["busy_share"], median_launch_to_start_us=queueing["median_launch_to_start_us"]))
    return out


class _Steady(NamedTuple):
    """What the steady-state checks read: the window's metrics, the steady step (µs), the step's breakdown by
    role (µs), the GPU utilization (0..1, None where it is not judged) and the thresholds."""

    metrics: dict[str, Any]
    step_us: float
    breakdown: dict[str, Any]
    utilization: float | None
    t: Thresholds

    def share(self, role: str) -> float:
        """Fraction 0..1 of the steady step spent in ``role`` (``kernel``, ``memcpy``, ...)."""
        return self.breakdown.get(role, 0.0) / self.step_us if self.step_us else 0.0

    @property
    def steps(self) -> int:
        return max(self.metrics.get("steps", 1), 1)


def _steady_state_rules(metrics: dict[str, Any], step_us: float, breakdown: dict[str, Any],
                        utilization: float | None, t: Thresholds) -> list[Diagnosis]:
    """Syncs, precision, attention, occupancy, copies, compilation, communication, alignment, variance; shares are
    of ``step_us`` (µs, the steady-state step)."""
    steady = _Steady(metrics, step_us, breakdown, utilization, t)
    verdicts = (check(steady) for check in STEADY_STATE_CHECKS)
    return [verdict for verdict in verdicts if verdict is not None]


def _host_sync(s: _Steady) -> Diagnosis | None:
    t = s.t
    syncs = s.metrics.get("host_sync") or {}
    # a sync costs what the device sat idle because the host waited (during it, and until the host launched
    # again): a wait on a busy device means the host is ahead, and costs nothing
    idle_us = syncs.get("device_idle_us_per_step", syncs.get("time_us_per_step", 0.0))
    sync_share = idle_us / s.step_us
    if syncs.get("per_step", 0.0) < t.syncs_per_step or sync_share < t.sync_time_share:
        return None
    sites = ", ".join(site["site"] for site in syncs.get("call_sites", [])[:2])
    kinds = ", ".join(f"{name} {count:.1f}" for name, count in syncs.get("by_kind_per_step", {}).items())
    return make(
        "host_sync", "warning", "The host waits for the GPU inside the step",
        f"{syncs['per_step']:.1f} synchronizations per step ({kinds}) hold the host "
        f"{syncs['time_us_per_step'] / 1e3:.2f} ms and leave the device idle {idle_us / 1e3:.2f} ms, "
        f"{pct(sync_share)} of the step (its idle time during each wait, and after it in the step up to the time "
        f"the wait spent on a busy device); "
        f"thresholds {t.syncs_per_step:g} and {pct(t.sync_time_share)}" + (f"; from {sites}" if sites else ""),
        sync_share,
        "Remove .item(), .cpu(), print(tensor) and torch.cuda.synchronize() from the step; log scalars every "
        "N steps; copy inputs with pin_memory=True and .to(device, non_blocking=True). "
        "torch.cuda.set_sync_debug_mode(\"warn\") points at each one.",
        syncs_per_step=syncs["per_step"], sync_time_share=sync_share)


def _fp32_matmul(s: _Steady) -> Diagnosis | None:
    t, metrics, step_us = s.t, s.metrics, s.step_us
    tensor = metrics.get("tensor_cores") or {}
    precision = metrics.get("eligible_precision") or {}
    if not tensor or tensor.get("tensor_core_share", 0.0) - tensor.get("tf32_share", 0.0) >= t.tensor_core_share:
        return None
    eligible_fp32 = max(tensor.get("fp32_simt_gemm_share", 0.0) * s.share("kernel"),
                        precision.get("fp32", 0.0) / s.steps / step_us if step_us else 0.0)
    tf32 = tensor.get("tf32_share", 0.0) * s.share("kernel")
    if eligible_fp32 >= t.fp32_eligible_share:
        return make(
            "fp32_matmul", "warning", "Matmuls and convolutions run in FP32 without Tensor Cores",
            f"{pct(tensor['tensor_core_share'])} of compute-kernel time is on Tensor Cores; FP32 GEMM/conv "
            f"kernels take {pct(eligible_fp32)} of the step; thresholds {pct(t.tensor_core_share)} and "
            f"{pct(t.fp32_eligible_share)}",
            eligible_fp32 * (1 - 1 / BF16_SPEEDUP),
            _autocast_fix(metrics),
            tensor_core_share=tensor["tensor_core_share"], fp32_eligible_share=eligible_fp32)
    if tf32 >= t.fp32_eligible_share:
        return make(
            "fp32_matmul", "info", "Matmuls run in TF32; bf16 would be faster still",
            f"TF32 Tensor Core kernels take {pct(tf32)} of the step; threshold {pct(t.fp32_eligible_share)}",
            tf32 * (1 - 1 / TF32_TO_BF16_SPEEDUP),
            "Use bf16 autocast: with torch.autocast(\"cuda\", dtype=torch.bfloat16): loss = model(batch).",
            tf32_share=tf32)
    return None


def _unfused_attention(s: _Steady) -> Diagnosis | None:
    attention = s.metrics.get("attention") or {}
    slow = attention.get("unfused", 0.0) + attention.get("math", 0.0)
    fast = attention.get("flash", 0.0) + attention.get("memory_efficient", 0.0) + attention.get("cudnn", 0.0)
    slow_share = slow / s.steps / s.step_us if s.step_us else 0.0
    if slow_share >= s.t.unfused_attention_share and slow > fast:
        return _attention_verdict(s.metrics, attention, slow_share, s.t)
    return None


def _low_occupancy(s: _Steady) -> Diagnosis | None:
    t = s.t
    occupancy = s.metrics.get("achieved_occupancy")
    if occupancy is None or occupancy >= t.occupancy_percent or (s.utilization or 0) < 0.5:
        return None
    return make(
        "low_occupancy", "info", "Kernels keep few warps resident per SM",
        f"estimated achieved occupancy {occupancy:.1f}%; threshold {t.occupancy_percent:g}%",
        s.share("kernel") * (1 - occupancy / t.occupancy_percent) * 0.25,
        "Larger batches or hidden sizes give kernels more blocks; check the top kernels' launch shapes.",
        achieved_occupancy=occupancy)


def _memcpy_heavy(s: _Steady) -> Diagnosis | None:
    t = s.t
    memcpy = s.metrics.get("memcpy") or {}
    share = s.share("memcpy")
    if memcpy.get("pageable_share", 0.0) < t.pageable_share or share < t.memcpy_share:
        return None
    return make(
        "memcpy_heavy", "warning" if share >= 0.05 else "info",
        "Host-to-device copies from pageable memory",
        f"{pct(memcpy['pageable_share'])} of host-device copy time is from pageable memory and copies take "
        f"{pct(share)} of the step; thresholds {pct(t.pageable_share)} and {pct(t.memcpy_share)}",
        share,
        "Pin and overlap: DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True).",
        pageable_share=memcpy["pageable_share"], memcpy_share=share)


def _compiling_in_window(s: _Steady) -> Diagnosis | None:
    if not (s.metrics.get("compile") or {}).get("compiling_in_window"):
        return None
    return make(
        "compile_warmup", "info", TITLES["compile_warmup"],
        "compiler events (dynamo/inductor) inside the window: the window's timings include compilation",
        0.0,
        "Capture after warm-up (a larger Schedule(skip_first=...)); if it recompiles every step, check "
        "torch._dynamo.explain(model)(batch) for graph breaks and dynamic shapes.",
        compiling_in_window=True)


def _communication_heavy(s: _Steady) -> Diagnosis | None:
    t = s.t
    communication = s.metrics.get("communication") or {}
    if communication.get("exposed_share", 0.0) < t.communication_exposed_share:
        return None
    return make(
        "communication_heavy", "warning", "Communication is not hidden behind compute",
        f"communication takes {pct(communication['share'])} of the step, {pct(communication['overlap'])} "
        f"overlapped; {pct(communication['exposed_share'])} exposed; threshold "
        f"{pct(t.communication_exposed_share)}",
        communication["exposed_share"],
        "Overlap gradient all-reduce with backward (DDP bucket_cap_mb, gradient_as_bucket_view=True), "
        "accumulate gradients with no_sync(), or use a compression hook." if communication.get("backward", True)
        else "The window has no backward: these collectives are the forward's (tensor or pipeline parallel, or "
        "inference). Overlap them with compute (async_op=True collectives waited on later, sequence-parallel "
        "overlap), batch more tokens per collective, or keep tensor parallelism inside one NVLink domain.",
        communication_share=communication["share"], overlap=communication["overlap"])


def _tensor_core_alignment(s: _Steady) -> Diagnosis | None:
    t = s.t
    misaligned = s.metrics.get("misaligned_gemms") or []
    misaligned_share = sum(m.get("device_us", 0.0) for m in misaligned) / s.steps / s.step_us
    # Tensor Cores need a GPU (a CPU-only trace has none to align for), and the GEMMs must take real time
    if not (misaligned and s.metrics.get("devices") and misaligned_share >= t.misaligned_gemm_share):
        return None
    return make(
        "tensor_core_alignment", "info", "Half-precision GEMMs with dimensions not multiples of 8",
        f"GEMMs whose inner or output dimension is not a multiple of 8 take {pct(misaligned_share)} of the "
        f"step; threshold {pct(t.misaligned_gemm_share)}: "
        + "; ".join(f"{m['op']} ×{m['count']}" for m in misaligned[:3]),
        misaligned_share * 0.5,
        "Pad hidden sizes, vocabulary and sequence lengths to multiples of 8 (64 is better), e.g. "
        "model.resize_token_embeddings(n, pad_to_multiple_of=64).",
        gemms=len(misaligned), misaligned_share=misaligned_share)


def _step_time_variance(s: _Steady) -> Diagnosis | None:
    t, metrics = s.t, s.metrics
    variance = metrics.get("step_us_p95_over_p50")
    if variance is None or variance < t.step_p95_over_p50:
        return None
    return make(
        "step_time_variance", "info", TITLES["step_time_variance"],
        f"p95/p50 of step time {variance:.2f} over {metrics.get('steps')} steps; threshold "
        f"{t.step_p95_over_p50:g}",
        # what the steps above the median cost: the mean step brought down to the median
        max(0.0, 1 - (metrics.get("step_us_p50") or s.step_us) / s.step_us),
        "Look for periodic work (logging, checkpointing, GC, data stalls) in the slow steps.",
        p95_over_p50=variance)


#: The steady-state checks, in the order their verdicts are listed.
STEADY_STATE_CHECKS = (_host_sync, _fp32_matmul, _unfused_attention, _low_occupancy, _memcpy_heavy,
                       _compiling_in_window, _communication_heavy, _tensor_core_alignment, _step_time_variance)


#: Query dtypes PyTorch's CPU flash-attention kernel takes (``use_flash_attention_cpp`` in sdp_utils_cpp).
CPU_FLASH_DTYPES = frozenset({"float", "double", "bfloat16", "half"})
#: The largest head dim the CUDA flash kernel takes.
FLASH_MAX_HEAD_DIM = 256


def _attention_verdict(metrics: dict[str, Any], attention: dict[str, float], slow_share: float,
                       t: Thresholds) -> dict[str, Any]:
    """``unfused_attention``: attention written out by hand, or SDPA on its math path, with the condition that
    ruled the fused kernels out (from the call's own arguments) and a fix that applies on this device."""
    threshold = f"threshold {pct(t.unfused_attention_share)}"
    inputs = metrics.get("sdpa_math") or {}
    if attention.get("math", 0.0) < attention.get("unfused", 0.0) or not inputs:
        if attention.get("math", 0.0) >= attention.get("unfused", 0.0):  # SDPA's math path, arguments unrecorded
            return make(
                "unfused_attention", "info", "SDPA runs its math path",
                f"scaled_dot_product_attention's math path takes {pct(slow_share)} of the step and no fused kernel "
                f"ran; {threshold}",
                slow_share * 0.5,
                "Run one step under torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION) (and "
                "EFFICIENT_ATTENTION): PyTorch then warns why each fused kernel was ruled out (dtype, head dim, mask, "
                "dropout on this device). record_shapes=True lets perfhooks read those arguments.",
                unfused_share=slow_share)
        return _hand_written_attention(metrics, slow_share, threshold)
    on_gpu = bool(metrics.get("devices"))
    dtypes = set(inputs.get("dtypes") or [])
    dropout = float(inputs.get("dropout_p") or 0.0)
    reasons: list[str] = []
    fixes: list[str] = []
    if inputs.get("head_dims_differ"):
        reasons.append("q, k and v have different head dims")
        fixes.append("give q, k and v the same head dim")
    if on_gpu:
        if dtypes & {"float", "double"}:
            reasons.append(f"{'/'.join(sorted(dtypes))} inputs (the flash kernel takes fp16/bf16)")
            fixes.append("run attention in bf16: with torch.autocast(\"cuda\", dtype=torch.bfloat16): ...")
        large = [d for d in inputs.get("head_dims") or [] if d > FLASH_MAX_HEAD_DIM]
        if large:
            reasons.append(f"head dim {max(large)} (the flash kernel takes up to {FLASH_MAX_HEAD_DIM})")
    else:
        if dropout > 0:
            reasons.append(f"dropout_p={dropout:g} (PyTorch's fused CPU kernel takes no dropout)")
        odd = sorted(dtypes - CPU_FLASH_DTYPES)
        if odd:
            reasons.append(f"{'/'.join(odd)} inputs (the fused CPU kernel takes float, double, bf16 or fp16)")
            fixes.append("cast q, k and v to float32 or bf16")
    seen = f"{inputs['calls']} call(s)" + (f", {inputs['masked']} with an attn_mask" if inputs.get("masked") else "")
    evidence = (f"scaled_dot_product_attention ran its math path ({seen}), {pct(slow_share)} of the step, and no "
                f"fused kernel ran; {threshold}")
    if reasons:
        evidence += "; ruled out by " + "; ".join(reasons)
    if fixes:
        return make("unfused_attention", "warning", "SDPA runs its math path, not a fused kernel", evidence,
                    slow_share * 0.5, "; ".join(fixes).capitalize() + ".", unfused_share=slow_share)
    if reasons and not on_gpu and dropout > 0:
        return make("unfused_attention", "info", "SDPA runs its math path (attention dropout on CPU)", evidence,
                    0.0, "Nothing to change for training on this device: the fused CPU kernel takes no dropout. "
                    "Evaluation (dropout off) and GPUs (flash and memory-efficient kernels take dropout) use fused "
                    "kernels.", unfused_share=slow_share)
    return make("unfused_attention", "info", "SDPA runs its math path", evidence, slow_share * 0.5,
                "Run one step under torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION) (and "
                "EFFICIENT_ATTENTION): PyTorch then warns why each fused kernel was ruled out.",
                unfused_share=slow_share)


def _hand_written_attention(metrics: dict[str, Any], slow_share: float, threshold: str) -> Diagnosis:
    """``unfused_attention`` on attention written out by hand: priced by its whole core (from the scores' matmul to
    the one that applies them, forward and backward), which SDPA replaces, so the gain is a ceiling; the fix passes
    the mask the trace shows applied (``attn_mask``: it computes the same thing; ``is_causal`` only for a causal
    one), and says where the fused kernels cannot run."""
    core = metrics.get("attention_core") or {}
    what = ("the attention's core, from the scores' matmul to the one that applies them, forward and backward "
            "(scaling, " + ("the mask, " if core.get("masked") else "") + "softmax, "
            + ("dropout, " if core.get("dropout") else "") + "transposes)" if core else
            "batched matmuls and a softmax (attention written out)")
    mask = (", attn_mask=keep)" if core.get("masked") else ")")
    call = f"torch.nn.functional.scaled_dot_product_attention(q, k, v{mask}"
    masked = (" where keep is True at the positions the scores' mask lets through (the same mask, as a boolean: "
              "scores.masked_fill(mask == 0, -inf) becomes attn_mask=mask != 0); is_causal=True replaces it only "
              "when the mask is causal" if core.get("masked") else
              " (is_causal=True only if the scores were masked causally)")
    cpu = (" On the CPU, its fused kernel takes no dropout in training: with dropout_p > 0 SDPA runs its math "
           "path and saves little, so set the attention's dropout to 0 there (HF: attention_dropout=0.0) or "
           "measure the change before keeping it." if core.get("dropout") and not metrics.get("devices") else "")
    return make(
        "unfused_attention", "warning", "Attention is written out by hand",
        f"{what} takes {pct(slow_share)} of the step and no fused attention kernel ran; SDPA replaces all of it, "
        f"so that share is the most it can save; {threshold}",
        slow_share,
        f"Call {call} instead of softmax(q @ k.transpose(-2, -1) / sqrt(d)) @ v{masked} (HF: "
        f"attn_implementation=\"sdpa\"; nn.MultiheadAttention: need_weights=False).{cpu}",
        unfused_share=slow_share, masked=bool(core.get("masked")), dropout=bool(core.get("dropout")))


def graph_warm_up(metrics: dict[str, Any], steady: dict[str, Any], t: Thresholds) -> bool:
    """The window is a CUDA-graph warm-up: graph captures take at least ``startup_share`` of it, and captures and
    graph set-up together at least a third. Its device idles while the host records and instantiates graphs, and
    its utilization is no finding (raising the work per step is the wrong advice for a warm-up)."""
    window_us = (metrics.get("step_us") or 0.0) * max(metrics.get("steps") or 1, 1)
    if not window_us or not steady.get("captures"):
        return False
    capture, setup = steady.get("capture_us", 0.0), steady.get("setup_us", 0.0)
    return capture >= t.startup_share * window_us and capture + setup >= GRAPH_WARM_UP_SHARE * window_us


#: Captures and graph set-up at least this share 0..1 of a window make it a graph warm-up (:func:`graph_warm_up`).
GRAPH_WARM_UP_SHARE = 1 / 3
