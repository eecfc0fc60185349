"""Verdicts from measurements: each rule says what fired, by how much, what fixing it could gain, and how.

Every diagnosis is a dict with ``id`` (stable, documented in the README), ``severity``
(``critical``, ``warning``, ``info``), ``title``, ``evidence`` (the numbers that fired and
the thresholds they crossed), ``measured`` (those numbers), ``estimated_gain`` (an
Amdahl-style upper bound on the fraction 0..1 of step time saved if fixed),
``recommendation`` (a concrete fix, with code where it helps) and ``docs`` (a link).
Rules read the trace metrics (:func:`diagnose_trace`), the live phase statistics
(:func:`diagnose_live`) or several ranks (:func:`diagnose_ranks`).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """When each rule fires. Shares and utilizations are fractions 0..1; occupancy is percent."""

    dataloader_share: float = 0.10
    dataloader_critical_share: float = 0.25
    gpu_utilization: float = 0.60
    short_kernel_share: float = 0.50
    host_wait_share: float = 0.50
    syncs_per_step: float = 1.0
    sync_time_share: float = 0.01
    misaligned_gemm_share: float = 0.01
    fp32_eligible_share: float = 0.10
    tensor_core_share: float = 0.10
    unfused_attention_share: float = 0.02
    occupancy_percent: float = 15.0
    pageable_share: float = 0.50
    memcpy_share: float = 0.01
    optimizer_share: float = 0.15
    communication_exposed_share: float = 0.05
    straggler_spread: float = 0.10
    step_p95_over_p50: float = 1.5
    warmup_slowdown: float = 3.0
    warmup_share: float = 0.05
    memory_fraction: float = 0.90
    evaluation_share: float = 0.25
    checkpoint_share: float = 0.10

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
                raise ValueError(f"Thresholds.{item.name} must be a number >= 0, got {value!r}")


#: Speed-up assumed for Tensor-Core-eligible FP32 work under bf16 autocast (conservative; up to ~8x on A100).
BF16_SPEEDUP = 3.0
#: ... and for TF32 work, which already runs on Tensor Cores.
TF32_TO_BF16_SPEEDUP = 1.5

DOCS = {
    "dataloader_bound": "https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading",
    "low_gpu_utilization": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html",
    "launch_bound": "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs",
    "host_sync": "https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html",
    "fp32_matmul": "https://pytorch.org/docs/stable/amp.html",
    "unfused_attention": "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html",
    "low_occupancy": "https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/index.html#occupancy",
    "memcpy_heavy": "https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html",
    "memory_near_limit": "https://pytorch.org/docs/stable/torch_cuda_memory.html",
    "memory_fragmentation": "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf",
    "activations_dominate": "https://pytorch.org/docs/stable/checkpoint.html",
    "compile_warmup": "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    "optimizer_heavy": "https://pytorch.org/docs/stable/optim.html#algorithms",
    "communication_heavy": "https://pytorch.org/docs/stable/notes/ddp.html",
    "straggler": "https://pytorch.org/docs/stable/distributed.html",
    "step_time_variance": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html",
    "tensor_core_alignment": "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/",
    "evaluation_heavy": "https://lightning.ai/docs/pytorch/stable/common/trainer.html#val-check-interval",
    "checkpoint_heavy": "https://pytorch.org/docs/stable/distributed.checkpoint.html#torch.distributed.checkpoint.async_save",
}

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def make(id: str, severity: str, title: str, evidence: str, gain: float, recommendation: str,
         **measured: Any) -> dict[str, Any]:
    return {"id": id, "severity": severity, "title": title, "evidence": evidence,
            "estimated_gain": round(max(0.0, min(1.0, gain)), 4), "recommendation": recommendation,
            "docs": DOCS[id], "measured": measured}


def rank(diagnoses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Largest estimated gain first; severity breaks ties; one entry per id (the larger gain)."""
    best: dict[str, dict[str, Any]] = {}
    for diagnosis in diagnoses:
        kept = best.get(diagnosis["id"])
        if kept is None or diagnosis["estimated_gain"] > kept["estimated_gain"]:
            best[diagnosis["id"]] = diagnosis
    return sorted(best.values(), key=lambda d: (-d["estimated_gain"], SEVERITY_ORDER[d["severity"]], d["id"]))


def pct(value: float) -> str:
    return f"{value:.1%}"


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
    """Rules that read one trace's metrics (see :func:`perfhooks.analysis.analyze.trace_metrics`)."""
    out: list[dict[str, Any]] = []
    step_us = metrics.get("step_us") or 0.0
    breakdown = metrics.get("breakdown") or {}
    if step_us <= 0:  # no steps, or steps of no duration: no rule has a premise
        return out

    def share(role: str) -> float:
        return breakdown.get(role, 0.0) / step_us if step_us else 0.0

    dataloader = share("dataloader")
    if dataloader >= t.dataloader_share:
        out.append(make(
            "dataloader_bound", "critical" if dataloader >= t.dataloader_critical_share else "warning",
            "Input pipeline holds the step back",
            f"DataLoader takes {pct(dataloader)} of the step ({breakdown['dataloader'] / 1e3:.1f} ms of "
            f"{step_us / 1e3:.1f} ms); threshold {pct(t.dataloader_share)}",
            dataloader,
            "Load batches in worker processes and keep them ahead of the GPU: "
            "DataLoader(dataset, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2).",
            dataloader_share=dataloader))
    utilization = metrics.get("gpu_utilization")
    # no kernel at all inside the steps is more likely device activity that was not recorded than an idle GPU
    if utilization is not None and 0 < utilization < t.gpu_utilization:
        out.append(make(
            "low_gpu_utilization", "critical" if utilization < t.gpu_utilization / 2 else "warning",
            "The GPU is idle for much of each step",
            f"GPU utilization {pct(utilization)} (kernels running ÷ "
            + ("step time" if metrics.get("step_rule", "profiler_steps") == "profiler_steps" else
               "the time of the window, which has no step markers")
            + f"); threshold {pct(t.gpu_utilization)}",
            1 - utilization,
            "Find what the GPU waits for in the idle breakdown and the diagnoses above; then raise the work per "
            "step (a larger batch) so launch and host overheads are amortized.",
            gpu_utilization=utilization))
    launch = metrics.get("launch") or {}
    idle = metrics.get("idle") or {}
    temporal = metrics.get("temporal") or {}
    launch_heavy = launch.get("short_kernel_share", 0.0) >= t.short_kernel_share
    # GPU idle time spent waiting on the host, less what the DataLoader already explains, and no more than the
    # time the host spent in launch calls: idle time behind other host work (Python, allocation) is not launch cost
    launch_calls = launch.get("launch_call_share")
    launch_gain = temporal.get("idle", 0.0) * idle.get("host_wait", 0.0) - dataloader
    if launch_calls is not None:
        launch_gain = min(launch_gain, launch_calls)
    if (launch_heavy and idle.get("host_wait", 0.0) >= t.host_wait_share and launch_gain >= 0.05
            and utilization is not None and utilization < 0.8):
        out.append(make(
            "launch_bound", "warning", "Kernel launches cannot keep the GPU fed",
            f"{pct(launch['short_kernel_share'])} of kernels run < 10 µs ({launch['kernels_per_step']:.0f} per step), "
            f"{pct(idle['host_wait'])} of GPU idle time waits on the host, and the host spends "
            f"{pct(launch_calls or 0.0)} of the step in launch calls; thresholds {pct(t.short_kernel_share)} "
            f"and {pct(t.host_wait_share)}",
            launch_gain,
            "Cut per-kernel launch cost: model = torch.compile(model, mode=\"reduce-overhead\") (CUDA graphs), "
            "fuse small ops, or raise the batch size.",
            short_kernel_share=launch["short_kernel_share"], host_wait_share=idle["host_wait"],
            launch_call_share=launch_calls))
    syncs = metrics.get("host_sync") or {}
    sync_share = syncs.get("time_us_per_step", 0.0) / step_us
    # a sync is a cost only if the host waited: many syncs that return at once hold nothing back
    if syncs.get("per_step", 0.0) >= t.syncs_per_step and sync_share >= t.sync_time_share:
        sites = ", ".join(s["site"] for s in syncs.get("call_sites", [])[:2])
        kinds = ", ".join(f"{name} {count:.1f}" for name, count in syncs.get("by_kind_per_step", {}).items())
        out.append(make(
            "host_sync", "warning", "The host waits for the GPU inside the step",
            f"{syncs['per_step']:.1f} synchronizations per step ({kinds}) hold the host "
            f"{syncs['time_us_per_step'] / 1e3:.2f} ms, {pct(sync_share)} of the step; thresholds "
            f"{t.syncs_per_step:g} and {pct(t.sync_time_share)}" + (f"; from {sites}" if sites else ""),
            sync_share,
            "Remove .item(), .cpu(), print(tensor) and torch.cuda.synchronize() from the step; log scalars every "
            "N steps; copy inputs with pin_memory=True and .to(device, non_blocking=True). "
            "torch.cuda.set_sync_debug_mode(\"warn\") points at each one.",
            syncs_per_step=syncs["per_step"], sync_time_share=sync_share))
    tensor = metrics.get("tensor_cores") or {}
    precision = metrics.get("eligible_precision") or {}
    steps = max(metrics.get("steps", 1), 1)
    eligible_fp32 = max(tensor.get("fp32_simt_gemm_share", 0.0) * share("kernel"),
                        precision.get("fp32", 0.0) / steps / step_us if step_us else 0.0)
    tf32 = tensor.get("tf32_share", 0.0) * (breakdown.get("kernel", 0.0) / step_us if step_us else 0.0)
    if tensor and tensor.get("tensor_core_share", 0.0) - tensor.get("tf32_share", 0.0) < t.tensor_core_share:
        if eligible_fp32 >= t.fp32_eligible_share:
            out.append(make(
                "fp32_matmul", "warning", "Matmuls and convolutions run in FP32 without Tensor Cores",
                f"{pct(tensor['tensor_core_share'])} of compute-kernel time is on Tensor Cores; FP32 GEMM/conv "
                f"kernels take {pct(eligible_fp32)} of the step; thresholds {pct(t.tensor_core_share)} and "
                f"{pct(t.fp32_eligible_share)}",
                eligible_fp32 * (1 - 1 / BF16_SPEEDUP),
                _autocast_fix(metrics),
                tensor_core_share=tensor["tensor_core_share"], fp32_eligible_share=eligible_fp32))
        elif tf32 >= t.fp32_eligible_share:
            out.append(make(
                "fp32_matmul", "info", "Matmuls run in TF32; bf16 would be faster still",
                f"TF32 Tensor Core kernels take {pct(tf32)} of the step; threshold {pct(t.fp32_eligible_share)}",
                tf32 * (1 - 1 / TF32_TO_BF16_SPEEDUP),
                "Use bf16 autocast: with torch.autocast(\"cuda\", dtype=torch.bfloat16): loss = model(batch).",
                tf32_share=tf32))
    attention = metrics.get("attention") or {}
    slow = attention.get("unfused", 0.0) + attention.get("math", 0.0)
    fast = attention.get("flash", 0.0) + attention.get("memory_efficient", 0.0) + attention.get("cudnn", 0.0)
    slow_share = slow / max(metrics.get("steps", 1), 1) / step_us if step_us else 0.0
    if slow_share >= t.unfused_attention_share and slow > fast:
        out.append(make(
            "unfused_attention", "warning", "Attention runs unfused",
            f"unfused/math attention takes {pct(slow_share)} of the step and no flash or memory-efficient kernel "
            f"ran; threshold {pct(t.unfused_attention_share)}",
            slow_share * 0.5,
            "Call torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...) with fp16/bf16 inputs "
            "so PyTorch picks flash or memory-efficient kernels (HF: attn_implementation=\"sdpa\").",
            unfused_share=slow_share))
    occupancy = metrics.get("achieved_occupancy")
    if occupancy is not None and occupancy < t.occupancy_percent and (utilization or 0) >= 0.5:
        out.append(make(
            "low_occupancy", "info", "Kernels keep few warps resident per SM",
            f"estimated achieved occupancy {occupancy:.1f}%; threshold {t.occupancy_percent:g}%",
            share("kernel") * (1 - occupancy / t.occupancy_percent) * 0.25,
            "Larger batches or hidden sizes give kernels more blocks; check the top kernels' launch shapes.",
            achieved_occupancy=occupancy))
    memcpy = metrics.get("memcpy") or {}
    if memcpy.get("pageable_share", 0.0) >= t.pageable_share and share("memcpy") >= t.memcpy_share:
        out.append(make(
            "memcpy_heavy", "warning" if share("memcpy") >= 0.05 else "info",
            "Host-to-device copies from pageable memory",
            f"{pct(memcpy['pageable_share'])} of host-device copy time is from pageable memory and copies take "
            f"{pct(share('memcpy'))} of the step; thresholds {pct(t.pageable_share)} and {pct(t.memcpy_share)}",
            share("memcpy"),
            "Pin and overlap: DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True).",
            pageable_share=memcpy["pageable_share"], memcpy_share=share("memcpy")))
    compiled = metrics.get("compile") or {}
    if compiled.get("compiling_in_window"):
        out.append(make(
            "compile_warmup", "info", "torch.compile was compiling inside the captured window",
            "compiler events (dynamo/inductor) inside the window: the window's timings include compilation",
            0.0,
            "Capture after warm-up (a larger Schedule(skip_first=...)); if it recompiles every step, check "
            "torch._dynamo.explain(model)(batch) for graph breaks and dynamic shapes.",
            compiling_in_window=True))
    communication = metrics.get("communication") or {}
    if communication.get("exposed_share", 0.0) >= t.communication_exposed_share:
        out.append(make(
            "communication_heavy", "warning", "Communication is not hidden behind compute",
            f"communication takes {pct(communication['share'])} of the step, {pct(communication['overlap'])} "
            f"overlapped; {pct(communication['exposed_share'])} exposed; threshold "
            f"{pct(t.communication_exposed_share)}",
            communication["exposed_share"],
            "Overlap gradient all-reduce with backward (DDP bucket_cap_mb, gradient_as_bucket_view=True), "
            "accumulate gradients with no_sync(), or use a compression hook.",
            communication_share=communication["share"], overlap=communication["overlap"]))
    misaligned = metrics.get("misaligned_gemms") or []
    misaligned_share = sum(m.get("device_us", 0.0) for m in misaligned) / steps / step_us
    # Tensor Cores need a GPU (a CPU-only trace has none to align for), and the GEMMs must take real time
    if misaligned and metrics.get("devices") and misaligned_share >= t.misaligned_gemm_share:
        out.append(make(
            "tensor_core_alignment", "info", "Half-precision GEMMs with dimensions not multiples of 8",
            f"GEMMs whose inner or output dimension is not a multiple of 8 take {pct(misaligned_share)} of the "
            f"step; threshold {pct(t.misaligned_gemm_share)}: "
            + "; ".join(f"{m['op']} ×{m['count']}" for m in misaligned[:3]),
            misaligned_share * 0.5,
            "Pad hidden sizes, vocabulary and sequence lengths to multiples of 8 (64 is better), e.g. "
            "model.resize_token_embeddings(n, pad_to_multiple_of=64).",
            gemms=len(misaligned), misaligned_share=misaligned_share))
    variance = metrics.get("step_us_p95_over_p50")
    if variance is not None and variance >= t.step_p95_over_p50:
        out.append(make(
            "step_time_variance", "info", "Step times vary within the window",
            f"p95/p50 of step time {variance:.2f} over {metrics.get('steps')} steps; threshold "
            f"{t.step_p95_over_p50:g}",
            # what the steps above the median cost: the mean step brought down to the median
            max(0.0, 1 - (metrics.get("step_us_p50") or step_us) / step_us),
            "Look for periodic work (logging, checkpointing, GC, data stalls) in the slow steps.",
            p95_over_p50=variance))
    return out


def diagnose_live(stats: Any, t: Thresholds = Thresholds(), min_steps: int = 10, compiled: bool = False,
                  run: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rules that need no trace: they read the engine's per-phase statistics on every run.

    Steps that perfhooks' own work overlapped (a capture window, a trace export, a window's
    analysis, a memory capture) are left out of the phase and variance rules. ``compiled`` says
    torch.compile compiled a graph during the run; ``run`` is the report's run account.
    """
    out = diagnose_run(run, t)
    if stats.steps < min_steps:
        return out
    wait = stats.steady_share("data_wait")
    if wait >= t.dataloader_share:
        out.append(make(
            "dataloader_bound", "critical" if wait >= t.dataloader_critical_share else "warning",
            "The training loop waits for data",
            f"fetching the next batch takes {pct(wait)} of step time (mean {stats.steady_mean('data_wait'):.2f} ms "
            f"a step, timed around the loader's next()); threshold {pct(t.dataloader_share)}",
            wait,
            "DataLoader(dataset, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2); "
            "move decoding/augmentation off the training process.",
            data_wait_share=wait))
    optimizer = stats.steady_share("optimizer")
    if optimizer >= t.optimizer_share:
        out.append(make(
            "optimizer_heavy", "warning", "The optimizer step takes a large share of each step",
            f"optimizer takes {pct(optimizer)} of step time; threshold {pct(t.optimizer_share)}",
            optimizer * 0.5,
            "Use a fused or foreach optimizer: torch.optim.AdamW(params, lr=..., fused=True) (CUDA), or "
            "foreach=True.",
            optimizer_share=optimizer))
    recent = list(stats.recent)
    own = sum(1 for timing in recent if timing.own)
    # steady state only: the first steps are warm-up, and perfhooks' own steps are not the user's
    steady = sorted(timing.step_ms for timing in recent[3:] if not timing.own)
    p50 = steady[len(steady) // 2] if steady else 0.0
    p95 = steady[min(len(steady) - 1, round(0.95 * (len(steady) - 1)))] if steady else 0.0
    if len(steady) >= min_steps and p50 > 0 and p95 / p50 >= t.step_p95_over_p50:
        out.append(make(
            "step_time_variance", "warning" if p95 / p50 >= 2 * t.step_p95_over_p50 else "info",
            "Some steps take much longer than the rest",
            f"step p95 {p95:.1f} ms is {p95 / p50:.2f}× the p50 {p50:.1f} ms over {len(steady)} steps "
            f"({own} steps that overlapped perfhooks' own work left out); threshold {t.step_p95_over_p50:g}×",
            max(0.0, 1 - p50 / statistics.fmean(steady)),
            "Look at what the slow steps do (periodic logging, .item() calls in callbacks, GC, data stalls); the "
            "per-phase p95 in the report shows which phase spikes.",
            p95_over_p50=p95 / p50))
    if compiled and len(recent) >= min_steps:
        first = [timing.step_ms for timing in recent[:3]]
        steady_ms = statistics.median(timing.step_ms for timing in recent[3:])
        excess = sum(max(0.0, ms - steady_ms) for ms in first)
        total = sum(timing.step_ms for timing in recent)
        slow = statistics.fmean(first) >= t.warmup_slowdown * steady_ms
        if steady_ms > 0 and slow and excess / total >= t.warmup_share:
            out.append(make(
                "compile_warmup", "info", "torch.compile compiled during the first steps",
                f"torch.compile compiled graphs in this run; the first 3 steps average {statistics.fmean(first):.1f} "
                f"ms vs a steady {steady_ms:.1f} ms ({excess / total:.1%} of the run's step time); thresholds "
                f"{t.warmup_slowdown:g}× and {pct(t.warmup_share)}",
                excess / total,
                "Expected once per process; if it recurs, look for recompilation "
                "(torch._logging.set_logs(recompiles=True)) and mark dynamic shapes (torch._dynamo.mark_dynamic).",
                first_steps_ms=statistics.fmean(first), steady_ms=steady_ms))
    return out


#: The run-account rules: (id, seconds key, count key, threshold field, gain per share, title, what, fix).
RUN_RULES = (
    ("evaluation_heavy", "evaluation_s", "evaluations", "evaluation_share", 0.5,
     "Evaluation takes a large share of the run", "evaluation(s)",
     "Evaluate less often or on fewer batches: Lightning Trainer(val_check_interval=..., limit_val_batches=...); "
     "transformers TrainingArguments(eval_steps=..., eval_strategy=...); in a hand-written loop, run the "
     "evaluation loop every N steps."),
    ("checkpoint_heavy", "checkpointing_s", "checkpoints", "checkpoint_share", 0.9,
     "Writing checkpoints takes a large share of the run", "checkpoint write(s), with training stopped,",
     "Save less often (Lightning ModelCheckpoint(every_n_train_steps=...), transformers "
     "TrainingArguments(save_steps=...)), or write in the background: Lightning "
     "Trainer(plugins=[AsyncCheckpointIO()]), torch.distributed.checkpoint.async_save."),
)


def diagnose_run(run: dict[str, Any] | None, t: Thresholds = Thresholds()) -> list[dict[str, Any]]:
    """Rules on the run account: evaluation and checkpoint writes as shares of the run's wall time.

    The gain is a share of wall time: evaluating half as often, or writing checkpoints in the background.
    """
    if not run or not run.get("wall_s"):
        return []
    out = []
    wall = run["wall_s"]
    for rule_id, seconds, count, threshold, gain, title, what, fix in RUN_RULES:
        share = run[seconds] / wall
        limit = getattr(t, threshold)
        if share >= limit:
            out.append(make(rule_id, "warning", title,
                            f"{run[count]} {what} took {run[seconds]:.2f} s, {pct(share)} of the {wall:.2f} s run; "
                            f"threshold {pct(limit)}", share * gain, fix, **{f"{seconds[:-2]}_share": share}))
    return out


def _straggler_fix(slowest: int) -> str:
    return (f"Every rank waits for rank {slowest} at each collective: check its data shard and loader, host load "
            "(other processes, CPU affinity), GPU clocks and thermals.")


def _apart(values: dict[int, float], smallest: bool) -> tuple[int, float, float]:
    """The rank with the smallest (or largest) value, that value, and the median of the other ranks'."""
    chosen, value = (min if smallest else max)(values.items(), key=lambda item: item[1])
    return chosen, value, statistics.median(v for r, v in values.items() if r != chosen)


def _straggler(slowest: int, excess_ms: float, step_ms: float, t: Thresholds, rule: str, evidence: str
               ) -> list[dict[str, Any]]:
    """The ``straggler`` verdict when the others lose ``excess_ms`` of the straggler's ``step_ms`` step waiting
    (at least ``straggler_spread`` of it); ``evidence`` has ``{share}`` and ``{step}`` left to fill."""
    if step_ms <= 0 or excess_ms / step_ms < t.straggler_spread:
        return []
    share = excess_ms / step_ms
    return [make(
        "straggler", "warning", f"Rank {slowest} is slower than the others",
        evidence.format(share=pct(share), step=f"{step_ms:.1f} ms")
        + f"; threshold {pct(t.straggler_spread)} of step time",
        share, _straggler_fix(slowest), slowest_rank=slowest, excess_ms=round(excess_ms, 3), rule=rule)]


def diagnose_stragglers(summaries: list[dict[str, Any]], t: Thresholds = Thresholds()) -> list[dict[str, Any]]:
    """The rank the others wait for, from the ranks' summaries (:func:`perfhooks.ranks.rank_summary`).

    Every rank of a synchronised run (DDP, FSDP 1 and 2, ZeRO, tensor parallel) ends its step together: the
    others wait for the slow one inside their collectives. So the rule, in order of the evidence present:

    1. **collective wait** (any parallelism; what HTA's straggler analysis reads): with every rank's time in
       collectives per step from an analysed window, the straggler is the rank that spends the *least* time
       in them; its lead over the median of the others is what they lose waiting.
    2. **time outside backward** (DDP only, where the wait is the gradient all-reduce in backward): with
       perfhooks' phases and no window figures, the rank with the most time outside backward.
    3. **step time** (ranks that do not synchronise): the slowest rank against the median.
    """
    ranked = [s for s in summaries if (s.get("step_ms") or {}).get("mean")]
    if len(ranked) < 2:
        return []
    step_of = {s["rank"]: s["step_ms"]["mean"] for s in ranked}
    collectives = {s["rank"]: s.get("collective_ms_per_step") for s in ranked}
    if all(value is not None for value in collectives.values()) and max(collectives.values()) > 0:
        slowest, least, others = _apart(collectives, smallest=True)
        excess = others - least
        return _straggler(slowest, excess, step_of[slowest], t, "collective_wait",
                          f"rank {slowest} spends {least:.1f} ms per step in collectives vs {others:.1f} ms on the "
                          f"others: they wait {excess:.1f} ms ({{share}} of its {{step}} step) for it. Rule: the rank "
                          f"that waits least in collectives (any parallelism)")
    backward = {s["rank"]: (s.get("phases_ms") or {}).get("backward", 0) for s in ranked}
    if all(value > 0 for value in backward.values()):
        outside = {r: max(0.0, step_of[r] - backward[r]) for r in step_of}
        slowest, worst, median = _apart(outside, smallest=False)
        excess = worst - median
        return _straggler(slowest, excess, step_of[slowest], t, "outside_backward",
                          f"rank {slowest} spends {worst:.1f} ms per step outside backward vs {median:.1f} ms on the "
                          f"others (+{excess:.1f} ms, {{share}} of its {{step}} step); the other ranks wait that long "
                          f"in the gradient all-reduce. Rule: time outside backward (DDP; no window's collective "
                          f"times to read)")
    median = statistics.median(step_of.values())
    slowest, worst = max(step_of.items(), key=lambda item: item[1])
    spread = (worst - median) / median if median else 0.0
    if spread < t.straggler_spread:
        return []
    return [make(
        "straggler", "warning", f"Rank {slowest} is slower than the others",
        f"rank {slowest} steps take {worst:.1f} ms vs a median of {median:.1f} ms (+{pct(spread)}). Rule: step "
        f"time (no phase or collective figures); threshold +{pct(t.straggler_spread)}",
        (worst - median) / worst, _straggler_fix(slowest), slowest_rank=slowest, spread=spread, rule="step_time")]
