"""The shape of a diagnosis, and their ranking.

Every diagnosis is a dict with ``id`` (stable, documented), ``severity`` (``critical``, ``warning``, ``info``),
``title``, ``evidence`` (the numbers that fired and the thresholds they crossed), ``measured`` (those numbers),
``estimated_gain`` (a ceiling: the most of the step, as a fraction 0..1, that the fix can save, the time on the
critical path it removes; of the run's wall time where ``gain_basis`` is ``"run"``),
``recommendation`` (a concrete fix) and ``docs`` (a link).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

DOCS = {
    "dataloader_bound": "https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading",
    "low_gpu_utilization": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html",
    "launch_bound": "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs",
    "host_bound": "https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html",
    "host_sync": "https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html",
    "fp32_matmul": "https://pytorch.org/docs/stable/amp.html",
    "unfused_attention": "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html",
    "low_occupancy": "https://docs.nvidia.com/cuda/cuda-c-best-practices-guide/index.html#occupancy",
    "memcpy_heavy": "https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html",
    "memory_near_limit": "https://pytorch.org/docs/stable/torch_cuda_memory.html",
    "memory_fragmentation": "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf",
    "activations_dominate": "https://pytorch.org/docs/stable/checkpoint.html",
    "memory_growth": "https://pytorch.org/docs/stable/torch_cuda_memory.html",
    "compile_warmup": "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    "recompiles": "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html#recompilation",
    "graph_breaks": "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html#graph-breaks",
    "optimizer_heavy": "https://pytorch.org/docs/stable/optim.html#algorithms",
    "communication_heavy": "https://pytorch.org/docs/stable/notes/ddp.html",
    "straggler": "https://pytorch.org/docs/stable/distributed.html",
    "step_time_variance": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html",
    "shape_churn": "https://huggingface.co/docs/transformers/main_classes/data_collator#transformers.DataCollatorWithPadding",
    "tensor_core_alignment": "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/",
    "evaluation_heavy": "https://lightning.ai/docs/pytorch/stable/common/trainer.html#val-check-interval",
    "startup_in_window": "https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule",
    "graph_capture_in_window": "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs",
    "window_not_steady": "https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule",
    "device_queued": "https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule",
    "padding_waste": "https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments.group_by_length",
    "other_heavy": "https://lightning.ai/docs/pytorch/stable/tuning/profiler_basic.html",
    "stalled": "https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications",
    "anomaly_detection": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#disable-debugging-apis",
    "cpu_threads": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#cpu-specific-optimizations",
    "debug_switches": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#disable-debugging-apis",
    "deterministic_algorithms": "https://pytorch.org/docs/stable/notes/randomness.html",
    "profiler_running": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#disable-debugging-apis",
    "shared_host": "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#cpu-specific-optimizations",
    "unrecorded_device_work": "https://pytorch.org/docs/stable/profiler.html#torch.profiler.profile",
    "evaluation_with_grad": "https://pytorch.org/docs/stable/generated/torch.no_grad.html",
    "foreach_off": "https://pytorch.org/docs/stable/optim.html#algorithms",
    "module_not_called": "https://pytorch.org/docs/stable/generated/torch.compile.html",
    "host_after_sync": "https://pytorch.org/docs/stable/generated/torch.cuda.synchronize.html",
    "activation_checkpointing": "https://pytorch.org/docs/stable/checkpoint.html",
    "small_micro_batches": "https://huggingface.co/docs/transformers/perf_train_gpu_one#batch-size-choice",
    "evaluation_batch": "https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments.per_device_eval_batch_size",
    "mixed_precision_slower": "https://pytorch.org/docs/stable/amp.html#cpu-ops-that-can-autocast-to-bfloat16",
    "checkpoint_heavy": "https://pytorch.org/docs/stable/distributed.checkpoint.html#torch.distributed.checkpoint.async_save",
}


#: One title per diagnosis that more than one source fires (a run's live figures and a trace), so that a verdict
#: reads the same in a run's table and in ``perfhooks analyze``.
TITLES = {
    "dataloader_bound": "The training loop waits for data",
    "step_time_variance": "Some steps take much longer than the rest",
    "shape_churn": "Steps that meet a batch shape for the first time are slow",
    "host_bound": "The GPU waits on the host's Python and framework work",
    "compile_warmup": "torch.compile was compiling during the measured steps",
}

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


class _Verdict(TypedDict):
    id: str
    #: ``critical``, ``warning`` or ``info``.
    severity: str
    title: str
    #: The numbers that fired and the thresholds they crossed.
    evidence: str
    #: An upper bound on the fraction 0..1 of step time fixing it would save.
    estimated_gain: float
    #: A concrete fix for the run at hand.
    recommendation: str
    docs: str
    #: The figures behind the evidence, by name.
    measured: dict[str, Any]


class Diagnosis(_Verdict, total=False):
    """One verdict, as ``report.json`` carries it (docs/report.md, "diagnoses"): the keys above always, these
    where they apply."""

    #: What ``estimated_gain`` is a share of: ``"step"`` (the default when absent) or ``"run"`` (wall time).
    gain_basis: str
    #: The rank whose figures it quotes, in a merged report of several ranks.
    rank: int
    #: The other ranks where the same verdict fired.
    also_ranks: list[int]
    #: The first step of the capture window whose trace fired it.
    step: int


def make(id: str, severity: str, title: str, evidence: str, gain: float, recommendation: str,
         **measured: Any) -> Diagnosis:
    return {"id": id, "severity": severity, "title": title, "evidence": evidence,
            "estimated_gain": round(max(0.0, min(1.0, gain)), 4), "recommendation": recommendation,
            "docs": DOCS[id], "measured": measured}


def rank(diagnoses: Iterable[Diagnosis]) -> list[Diagnosis]:
    """Largest estimated gain first; severity breaks ties; one entry per id (the larger gain)."""
    best: dict[str, Diagnosis] = {}
    for diagnosis in diagnoses:
        kept = best.get(diagnosis["id"])
        if kept is None or diagnosis["estimated_gain"] > kept["estimated_gain"]:
            best[diagnosis["id"]] = diagnosis
    return sorted(best.values(), key=lambda d: (-d["estimated_gain"], SEVERITY_ORDER[d["severity"]], d["id"]))


def gain_phrase(diagnosis: Diagnosis | dict[str, Any]) -> str:
    """The estimated gain in words, as the ceiling it is: the most the fix can save, of the step (or, with
    ``gain_basis`` ``"run"``, of the run's wall time). Empty for a verdict that saves nothing by itself."""
    gain = float(diagnosis.get("estimated_gain") or 0.0)
    if gain <= 0:
        return ""
    basis = "the run's wall time" if diagnosis.get("gain_basis") == "run" else "the step"
    return f"saves at most {gain:.0%} of {basis}" if gain >= 0.01 else f"saves under 1% of {basis}"


def pct(value: float) -> str:
    return f"{value:.1%}"
