"""The settings audit's verdicts: what the run is configured to do that slows it (``report.json``'s ``settings``,
read by :mod:`perfhooks.device.settings`).

A setting is the cheapest cause to find and to fix, so each one that applies is a verdict with its price. Where
perfhooks cannot switch the setting off to measure it (it would change the user's program), the gain is the most
that the phases the setting slows could give back, and says so: ``measured["ceiling"]`` names what bounds it,
and ``perfhooks tune`` measures the fix (``anomaly_off``, ``threads``, ``bf16``).

The ids: ``anomaly_detection``, ``cpu_threads``, ``debug_switches``, ``deterministic_algorithms``,
``profiler_running``, ``fp32_matmul`` (live, beside the trace's), ``shared_host``.
"""

from __future__ import annotations

from typing import Any

from perfhooks.rules.recipe import bf16_gain
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import Diagnosis, make, pct

#: What each debugging variable costs, and where it applies (``cuda``: only on an NVIDIA GPU run; ``ranks``: only
#: with several ranks).
DEBUG_SWITCHES: dict[str, tuple[str, str]] = {
    "CUDA_LAUNCH_BLOCKING": ("cuda", "every kernel launch waits for the kernel to finish: the host and the GPU "
                                     "never overlap"),
    "PYTORCH_NO_CUDA_MEMORY_CACHING": ("cuda", "every tensor is allocated with cudaMalloc and freed with cudaFree, "
                                               "which synchronize the device"),
    "TORCH_USE_CUDA_DSA": ("cuda", "device-side assertions, where torch was built with them, check every kernel"),
    "NCCL_DEBUG": ("ranks", "NCCL logs every collective"),
    "TORCH_LOGS": ("any", "torch logs its internals (dynamo, inductor, ...) as it runs"),
    "TORCHDYNAMO_VERBOSE": ("any", "dynamo prints its full traces"),
    "TORCH_SHOW_CPP_STACKTRACES": ("any", "every C++ error builds a symbolized stack"),
}

#: ``torch.cuda.get_sync_debug_mode()``: 1 warns, 2 raises at every synchronizing call.
SYNC_DEBUG = {1: "warn", 2: "error"}

#: CPU matmul types by what the processor has: the fix names the type it runs natively.
CPU_TYPES = {"amx": "AMX (bf16 tile matmuls)", "avx512_bf16": "AVX512-BF16"}


def compute_share(stats: Any) -> float:
    """Forward, backward and optimizer's share 0..1 of the steady step (0 before any detailed step)."""
    if not getattr(stats, "sampled_steps", 0):
        return 0.0
    return sum(stats.steady_share(name) for name in ("forward", "backward", "optimizer"))


def diagnose_settings(settings: dict[str, Any] | None, stats: Any, t: Thresholds = Thresholds(), *,
                      framework: str | None = None, device_type: str = "cpu", world_size: int = 1,
                      matmul_dtype: tuple[str, str] = ("fp32", ""), run: dict[str, Any] | None = None
                      ) -> list[Diagnosis]:
    """Every setting of ``settings`` (the report's ``settings`` section) that slows this run, as verdicts.

    ``stats``: the run's phase statistics (the ceilings come from the phases each setting slows);
    ``matmul_dtype``: the run's ``(dtype, its source)``; ``run``: the report's run account (the evaluation's
    share of the wall time).
    """
    if not settings:
        return []
    since = settings.get("since") or {}
    return [verdict for verdict in (
        _anomaly(settings, since, stats, framework),
        _threads(settings, stats, device_type, int(settings.get("ranks_on_host") or 1), host_shared(settings, t)),
        _debug_switches(settings, device_type, world_size),
        _deterministic(settings, since),
        _profiler(settings, since, stats),
        _precision(settings, stats, device_type, framework, matmul_dtype, tuple(settings.get("param_dtypes") or ())),
        _shared_host(settings, t),
        _evaluation_grad(settings, run, framework),
        _foreach_off(settings, stats),
    ) if verdict is not None]


def _fwd_bwd(stats: Any) -> float:
    if not getattr(stats, "sampled_steps", 0):
        return 0.0
    return stats.steady_share("forward") + stats.steady_share("backward")


def _anomaly(settings: dict[str, Any], since: dict[str, int], stats: Any, framework: str | None) -> Diagnosis | None:
    if "anomaly_detection" not in since:
        return None
    share = _fwd_bwd(stats)
    now = "is on" if settings.get("anomaly_detection") else f"was on from step {since['anomaly_detection']}"
    nan = " and checks every gradient for NaN" if settings.get("anomaly_check_nan") is not False else ""
    fix = ("Trainer(detect_anomaly=False) (Lightning's default), and no torch.autograd.set_detect_anomaly(True) in "
           "the script" if framework == "lightning" else
           "Remove torch.autograd.set_detect_anomaly(True) (or the `with torch.autograd.detect_anomaly():` around "
           "training) from the script; turn it on only to find where a NaN comes from, for a few steps")
    return make(
        "anomaly_detection", "warning", "Autograd anomaly detection is on",
        f"torch.autograd anomaly detection {now}: autograd records a Python stack for every operation of the "
        f"forward{nan} in the backward; forward and backward, where it costs, take {pct(share)} of the step "
        "(the most switching it off saves; typically a quarter to a half of them: perfhooks tune --only "
        "anomaly_off measures it)",
        share, fix + ".", forward_backward_share=round(share, 4), ceiling="forward and backward share",
        since_step=since["anomaly_detection"])


def idle_cpus(cpus: int, others_share: float | None) -> int:
    """The CPUs other processes leave idle: ``cpus`` less their measured share, rounded, at least 1."""
    if others_share is None:
        return cpus
    return max(1, round(cpus * (1 - others_share)))


def _threads(settings: dict[str, Any], stats: Any, device_type: str, ranks_on_host: int,
             others_share: float | None = None) -> Diagnosis | None:
    """``cpu_threads``; on a shared host (``others_share``: other processes' share of the CPUs) no more threads are
    advised than the CPUs they leave idle: threads beyond them wait for the others' processes."""
    threads, cpus = settings.get("intra_op_threads"), settings.get("usable_cpus")
    if not threads or not cpus or device_type != "cpu":
        return None
    fair = max(1, cpus // max(1, ranks_on_host))
    omp = (settings.get("environment_threads") or {}).get("OMP_NUM_THREADS")
    share = compute_share(stats)
    ranks = f" ({ranks_on_host} ranks share them: {fair} each)" if ranks_on_host > 1 else ""
    workers = int(settings.get("loader_workers") or 0)
    room = max(1, fair - workers)  # the CPUs the loader's workers leave to training
    if others_share is not None and threads < room and threads >= min(room, idle_cpus(fair, others_share)):
        return None  # the CPUs beyond its threads are the other processes': more threads would wait for them
    if others_share is not None:
        room = min(room, idle_cpus(fair, others_share))
    if threads < room:
        gain = share * (1 - threads / room)
        cause = f" (OMP_NUM_THREADS={omp} in the environment)" if omp else ""
        left = f", {room} of them left by {workers} loader worker(s)" if workers else ""
        return make(
            "cpu_threads", "warning", "Training runs on fewer threads than the CPUs it may use",
            f"torch.get_num_threads() is {threads}{cause} while this process may use {cpus} CPUs "
            f"(os.sched_getaffinity){ranks}{left}; forward, backward and optimizer run on those threads and take "
            f"{pct(share)} of the step: with {room} threads they take at most {threads}/{room} as long"
            + (f" (other processes use {pct(others_share)} of the CPUs: {room} are idle)" if others_share else ""),
            gain, f"torch.set_num_threads({room}), or remove torch.set_num_threads({threads})"
            + (" and OMP_NUM_THREADS" if omp else "") + " from the script (torch uses every usable CPU by default).",
            intra_op_threads=threads, usable_cpus=cpus, threads_fair=room, compute_share=round(share, 4),
            ceiling="compute share x (1 - threads / CPUs)")
    if threads <= fair and workers and threads + workers > fair:
        return make(
            "cpu_threads", "warning", "Loader workers and training threads outnumber the CPUs",
            f"{workers} DataLoader worker process(es) and {threads} intra-op thread(s) share the {fair} CPU(s) this "
            f"process may use{ranks}: the workers take CPUs from forward and backward while they fetch (they take "
            "turns on the CPUs); the cost is not measured here: perfhooks tune measures each setting",
            0.0, f"Keep workers + threads within {fair}: torch.set_num_threads({max(1, fair - workers)}) with "
            f"{workers} worker(s), or fewer workers (num_workers={max(0, fair - threads)}); with this few CPUs, doing "
            "the per-sample work once before training often beats both.",
            intra_op_threads=threads, usable_cpus=cpus, loader_workers=workers, threads_fair=fair)
    if threads > fair:
        return make(
            "cpu_threads", "warning", "More training threads than CPUs",
            f"torch.get_num_threads() is {threads} while this process may use {cpus} CPUs{ranks}: the threads take "
            "turns on the CPUs and wait for each other at every parallel operation (oversubscription); the cost "
            "is not measured here: perfhooks tune --only threads measures it",
            0.0, f"torch.set_num_threads({fair}).",
            intra_op_threads=threads, usable_cpus=cpus, threads_fair=fair)
    return None


def _debug_switches(settings: dict[str, Any], device_type: str, world_size: int) -> Diagnosis | None:
    found = []
    for name, value in (settings.get("environment") or {}).items():
        where, what = DEBUG_SWITCHES.get(name, ("any", "a debugging switch"))
        if (where == "cuda" and device_type != "cuda") or (where == "ranks" and world_size <= 1):
            continue
        found.append((f"{name}={value}", what))
    mode = SYNC_DEBUG.get(int(settings.get("sync_debug_mode") or 0))
    if mode is not None:
        found.append((f'torch.cuda.set_sync_debug_mode("{mode}")', "every synchronizing call is checked and "
                                                                   f"{'warned' if mode == 'warn' else 'raised'} on"))
    if not found:
        return None
    blocking = any(name.startswith(("CUDA_LAUNCH_BLOCKING", "PYTORCH_NO_CUDA_MEMORY_CACHING")) for name, _ in found)
    names = ", ".join(name for name, _ in found)
    return make(
        "debug_switches", "warning" if blocking else "info", "Debugging switches are left on",
        "; ".join(f"{name}: {what}" for name, what in found)
        + ("; with the launches serialized, the step is the host's time plus the GPU's, where it could be the "
           "larger of the two: at most half of it" if blocking else ""),
        0.5 if blocking else 0.0,
        f"Unset them where training runs for speed ({names}); keep them for debugging runs.",
        switches=[name for name, _ in found], ceiling="half the step" if blocking else None)


def _deterministic(settings: dict[str, Any], since: dict[str, int]) -> Diagnosis | None:
    cudnn = settings.get("cudnn_deterministic")
    if "deterministic_algorithms" not in since and not cudnn:
        return None
    which = " and ".join(name for name, on in (("torch.use_deterministic_algorithms(True)",
                                                "deterministic_algorithms" in since),
                                               ("torch.backends.cudnn.deterministic = True", cudnn)) if on)
    return make(
        "deterministic_algorithms", "info", "Deterministic algorithms are required",
        f"{which}: operations with a faster nondeterministic kernel (scatter-add, index-add, some convolutions' "
        "backward, cuBLAS without a fixed workspace) take the deterministic one. A choice, with its price",
        0.0, "Keep it where bit-exact reruns matter; otherwise torch.use_deterministic_algorithms(False) and "
        "torch.backends.cudnn.deterministic = False.", deterministic=True)


def _profiler(settings: dict[str, Any], since: dict[str, int], stats: Any) -> Diagnosis | None:
    if "profiler_running" not in since:
        return None
    share = compute_share(stats)
    return make(
        "profiler_running", "warning", "Another profiler records the run",
        f"the autograd profiler was on outside perfhooks' own windows (from step {since['profiler_running']}: "
        "torch.profiler.profile, torch.autograd.profiler.profile or emit_nvtx): it records every operation of "
        f"forward, backward and optimizer, which take {pct(share)} of the step (the most it can cost)",
        share, "Remove the profiler around training (perfhooks opens torch.profiler windows of its own on a "
        "schedule: perfhooks.Schedule(...)), or keep it to a few steps.",
        compute_share=round(share, 4), ceiling="compute share", since_step=since["profiler_running"])


def _precision(settings: dict[str, Any], stats: Any, device_type: str, framework: str | None,
               matmul_dtype: tuple[str, str], param_dtypes: tuple[str, ...]) -> Diagnosis | None:
    """``fp32_matmul``, live: the run's matmuls are fp32 (measured, or no setting and fp32 parameters) on hardware
    with a faster type: bf16 on a CPU with AMX or AVX512-BF16; bf16 (or TF32) on an Ampere or later GPU."""
    if matmul_dtype[0] != "fp32" or (param_dtypes and set(param_dtypes) != {"float32"}):
        return None
    share = _fwd_bwd(stats)
    spelled = {"lightning": 'Trainer(precision="bf16-mixed")', "transformers": "TrainingArguments(bf16=True)",
               "accelerate": 'Accelerator(mixed_precision="bf16")'}
    if device_type == "cpu":
        kind = settings.get("faster_cpu_type")
        if kind not in CPU_TYPES:
            return None
        setting = spelled.get(framework or "", "with torch.autocast(\"cpu\", dtype=torch.bfloat16): loss = "
                                               "model(x, y)")
        if framework == "transformers":
            setting = "TrainingArguments(bf16=True, use_cpu=True)"
        measured = bf16_gain(settings, stats, share)
        if measured is not None and measured[0] <= 0:
            return None  # bf16 measured no faster on the run's own shapes: a measurement overrules the estimate
        priced = (f"; {measured[1]}: bf16 saves about {pct(measured[0])} of the step (an estimate from that ratio; "
                  "perfhooks tune --only bf16 measures the whole step)" if measured is not None else
                  " (the most bf16 can save; an estimate, since some CPU kernels are slower in bf16: "
                  "scaled_dot_product_attention's flash backward among them. perfhooks tune --only bf16 measures it)")
        return make(
            "fp32_matmul", "warning", "Training runs in FP32 on a CPU with native bf16",
            f"the matmuls run in fp32 ({matmul_dtype[1] or 'no mixed precision setting seen'}) on a CPU with "
            f"{CPU_TYPES[kind]}, which runs bf16 matmuls natively; forward and backward take {pct(share)} of the "
            f"step{priced}",
            measured[0] if measured is not None else share,
            f"bf16 autocast: {setting}; check the loss, and measure before keeping it.",
            forward_backward_share=round(share, 4), cpu_type=kind,
            ceiling="measured bf16 ratio" if measured is not None else "forward and backward share")
    capability = settings.get("capability")
    if device_type != "cuda" or not capability or capability[0] < 8:
        return None
    if settings.get("float32_matmul_precision") not in (None, "highest"):
        return None  # TF32 is on: the trace's rule says what bf16 would add
    setting = spelled.get(framework or "", 'with torch.autocast("cuda", dtype=torch.bfloat16): loss = model(x, y)')
    return make(
        "fp32_matmul", "warning", "Training runs in FP32 on a GPU with bf16 and TF32 Tensor Cores",
        f"the matmuls run in fp32 ({matmul_dtype[1] or 'no mixed precision setting seen'}) on a compute "
        f"capability {capability[0]}.{capability[1]} GPU, whose Tensor Cores run bf16 and TF32; forward and "
        f"backward take {pct(share)} of the step (the most it can save; a capture window's trace prices it)",
        share, f"bf16 autocast: {setting}; or, keeping fp32 numerics close, TF32: "
        'torch.set_float32_matmul_precision("high").',
        forward_backward_share=round(share, 4), capability=list(capability), ceiling="forward and backward share")


def _evaluation_grad(settings: dict[str, Any], run: dict[str, Any] | None, framework: str | None
                     ) -> Diagnosis | None:
    """``evaluation_with_grad``: forwards inside an evaluation the run marks ran with grad enabled: each builds an
    autograd graph (and keeps its activations) that nothing backpropagates."""
    forwards = int(settings.get("evaluation_grad_forwards") or 0)
    if not forwards:
        return None
    wall, evaluation = (run or {}).get("wall_s") or 0.0, (run or {}).get("evaluation_s") or 0.0
    share = evaluation / wall if wall else 0.0
    fix = ("Wrap the evaluation in torch.no_grad() (or torch.inference_mode()): model.eval(); with torch.no_grad(): "
           "for batch in eval_loader: ..." + (" (inside with perf.evaluation():)" if framework == "pytorch" else ""))
    verdict = make(
        "evaluation_with_grad", "warning", "Evaluation builds autograd graphs",
        f"{forwards} forward(s) inside the evaluation ran with grad enabled: each records an autograd graph and keeps "
        f"its activations, which nothing backpropagates; the evaluation takes {pct(share)} of the run's wall time "
        "(the most no_grad can save; it usually saves a third or more of it, and the activations' memory)",
        share, fix + ".", evaluation_grad_forwards=forwards, evaluation_share=round(share, 4),
        ceiling="the evaluation's share of the run")
    verdict["gain_basis"] = "run"
    return verdict


#: ``foreach=False`` is named from this many parameter tensors: one small kernel (or loop) each.
FOREACH_TENSORS = 50


def _foreach_off(settings: dict[str, Any], stats: Any) -> Diagnosis | None:
    """``foreach_off`` (information): an optimizer built with ``foreach=False`` over many parameter tensors updates
    them one by one; torch's default groups them (``foreach``, or ``fused`` on a GPU)."""
    many = [entry for entry in settings.get("foreach_off") or [] if entry["tensors"] >= FOREACH_TENSORS]
    if not many:
        return None
    share = stats.steady_share("optimizer") if getattr(stats, "sampled_steps", 0) else 0.0
    named = ", ".join(f"{entry['optimizer']} over {entry['tensors']} tensors" for entry in many)
    return make(
        "foreach_off", "info", "The optimizer updates its parameters one tensor at a time",
        f"{named} built with foreach=False: each tensor's update is its own set of small operations, where the "
        f"default groups them; the optimizer takes {pct(share)} of the step (the most it can save)",
        share, "Drop foreach=False (torch's default groups the tensors), or pass fused=True where the optimizer "
        "has it; keep foreach=False only where memory is too tight for the grouped update.",
        optimizer_share=round(share, 4), optimizers=many)


def _shared_host(settings: dict[str, Any], t: Thresholds) -> Diagnosis | None:
    host = settings.get("host") or {}
    share = host.get("others_share")
    if share is None or share < t.shared_host_share:
        return None
    return make(
        "shared_host", "info", "Other processes share this process's CPUs",
        f"other processes used {pct(share)} of the {settings.get('usable_cpus')} CPUs this process may use over "
        f"{host.get('wall_s', 0):.1f} s (/proc/stat's busy time less this process's own); threshold "
        f"{pct(t.shared_host_share)}. Step times vary with the host's load, not with the program",
        0.0, "Measure on an idle machine (or pin the job to CPUs of its own: taskset, the scheduler's "
             "exclusive allocation) before reading step-time variance as the program's.",
        others_share=share)


def host_shared(settings: dict[str, Any] | None, t: Thresholds) -> float | None:
    """Others' share 0..1 of this process's CPUs when it crosses ``shared_host``'s threshold, else None."""
    share = ((settings or {}).get("host") or {}).get("others_share")
    return share if share is not None and share >= t.shared_host_share else None


#: The verdicts drawn from the step's phases: none stands when the phases were never seen.
PHASE_VERDICTS = frozenset({"dataloader_bound", "optimizer_heavy", "other_heavy", "padding_waste", "anomaly_detection",
                            "cpu_threads", "profiler_running", "fp32_matmul", "step_time_variance", "shape_churn",
                            "activation_checkpointing", "small_micro_batches", "mixed_precision_slower"})


def module_not_called(message: str) -> Diagnosis:
    """``module_not_called``: the plain loop was given a module whose training forward never ran (``message``
    says which and what to pass instead)."""
    return make("module_not_called", "warning", "perfhooks watches a module the loop does not call",
                message[0].upper() + message[1:] + ". Forward and backward read 0%, and no verdict is drawn from "
                "the phases", 0.0, "Pass the module the loop calls to perfhooks.profile (the compiled one).")
