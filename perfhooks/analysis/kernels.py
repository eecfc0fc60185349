"""What ran on the device: top kernels, Tensor Core use, attention implementations, launch behaviour."""

from __future__ import annotations

import bisect
import contextlib
import re
from functools import lru_cache
from typing import Any

import numpy as np

from perfhooks.analysis import spans
from perfhooks.analysis.columns import ABSENT, Columns
from perfhooks.analysis.operators import device_time_inside
from perfhooks.analysis.overview import communication_kernels, launch_table
from perfhooks.analysis.trace import Event, Trace

#: Kernel-name fragments of Tensor Core (NVIDIA) and matrix-core (AMD MFMA) kernels. A family name alone
#: (``xmma``, ``cutlass``) is not evidence: cuBLAS's ``sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma`` is plain FP32,
#: so the FP32-only tokens (:data:`FP32_ONLY_KERNEL`) are checked first.
TENSOR_CORE_KERNEL = re.compile(
    r"884|1688|16816|16832|hmma|imma|xmma|wgmma|tensorop|_tc_|mma_|gmma|flash|fmha|"
    r"bf16|fp16|f16f16|e4m3|e5m2|fp8|_MI\d+x\d+x\d+|mfma|xdlops|_xdl_|cutlass.*(?:h|bf)16", re.IGNORECASE)
#: Tokens that say every operand is FP32 on the FMA units (no Tensor Core), whatever the kernel's family.
FP32_ONLY_KERNEL = re.compile(r"_ffma|ffma_|f32f32_f32f32_f32(?!_?tf32)", re.IGNORECASE)
#: Tensor Core kernels running TF32 (FP32 inputs on Tensor Cores).
TF32_KERNEL = re.compile(r"tf32|s1688|s16816|s16832|xmma_gemm_f32f32_tf32", re.IGNORECASE)
#: Kernels that are clearly plain FP32 SIMT math (no Tensor Cores): cuBLAS/cuDNN ``sgemm``/``scudnn`` kernels and
#: cuDNN's templated FP32 convolution engines (data and weight gradients, Winograd), named ``...<float, ...>``.
FP32_SIMT_KERNEL = re.compile(r"sgemm|scudnn|gemmSN_|implicit_convolve_sgemm|fp32|f32f32_f32f32_f32|"
                              r"(?:dgrad|wgrad)\w*_engine<float|winograd\w*<float", re.IGNORECASE)

ATTENTION_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("flash", re.compile(r"flash", re.IGNORECASE)),
    ("memory_efficient", re.compile(r"fmha_cutlass|efficient_attention|mem_eff|attention_kernel_batched",
                                    re.IGNORECASE)),
    ("cudnn", re.compile(r"cudnn.*(?:sdpa|fmha|flash|attn)|sdpa.*cudnn", re.IGNORECASE)),
)
ATTENTION_OPS: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory_efficient",
    "aten::_efficient_attention_forward": "memory_efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_native_multi_head_attention": "unfused",
}

#: Fused attention ops on CPU (no kernels to name them by).
ATTENTION_OPS_CPU: dict[str, str] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_fused_attention_overrideable": "flash",
}
SOFTMAX_OPS = ("aten::_softmax", "aten::softmax", "aten::_safe_softmax",
               # the backward's: a CUDA trace can hold it where the forward softmax event is missing (an H100 trace
               # of attention written by hand had the backward on [8, 16, 1024, 1024] and no forward softmax)
               "aten::_softmax_backward_data", "aten::softmax_backward_data")
BATCHED_MATMUL_OPS = ("aten::bmm", "aten::baddbmm")

SHORT_KERNEL_US = 10.0


def kernel_breakdown(trace: Trace, top: int = 10) -> dict[str, Any]:
    """Top kernels by total device time: name, count, total and mean µs, share of kernel time."""
    totals = grouped_totals(trace.columns("kernels"), lambda name: name or "?")
    kernel_time = sum(entry[1] for entry in totals.values())
    ranked = sorted(totals.items(), key=lambda item: item[1][1], reverse=True)[:top]
    return {
        "kernel_us": kernel_time,
        "top": [{"name": name, "count": count, "total_us": total, "mean_us": total / count,
                 "share": total / kernel_time if kernel_time else 0.0} for name, (count, total) in ranked],
    }


def grouped_totals(columns: Columns, key: Any, rows: np.ndarray | None = None) -> dict[Any, list[Any]]:
    """``{key(name): [count, µs]}`` over the rows (all by default), the keys in the order their first row comes,
    each group's µs summed in row order."""
    codes = columns.name if rows is None else columns.name[rows]
    durations = columns.dur if rows is None else columns.dur[rows]
    keys = [key(name) for name in columns.names]
    groups = dict.fromkeys(keys)
    group_of = {k: index for index, k in enumerate(groups)}
    group = np.asarray([group_of[k] for k in keys], dtype=np.int64)[codes] if keys else codes
    # first rows' order: the groups as a dict filled row by row would hold them
    present, first = np.unique(group, return_index=True)
    counts = np.bincount(group, minlength=len(groups))
    sums = np.bincount(group, weights=durations, minlength=len(groups))
    names = list(groups)
    return {names[g]: [int(counts[g]), float(sums[g])] for g in present[np.argsort(first, kind="stable")].tolist()}


@lru_cache(maxsize=65536)
def kernel_math(name: str) -> str:
    """``tf32``, ``tensor_core``, ``fp32_simt`` or ``other``, from a kernel's name (cached: names repeat)."""
    if TF32_KERNEL.search(name):
        return "tf32"
    if FP32_ONLY_KERNEL.search(name):
        return "fp32_simt"
    if TENSOR_CORE_KERNEL.search(name):
        return "tensor_core"
    if FP32_SIMT_KERNEL.search(name):
        return "fp32_simt"
    return "other"


@lru_cache(maxsize=65536)
def attention_kind(name: str) -> str | None:
    for kind, pattern in ATTENTION_KINDS:
        if pattern.search(name):
            return kind
    return None


def stream_breakdown(trace: Trace) -> list[dict[str, Any]]:
    """Device time per (device, stream): kernels, memcpys and memsets, busiest first."""
    device = trace.columns("device_events")
    totals: dict[tuple[Any, Any], list[float]] = {}
    if (device.device == ABSENT).any():  # a device that is not a number (a pid written as text): event by event
        for event in device.events:
            entry = totals.setdefault((event.device, event.tid), [0, 0.0])
            entry[0] += 1
            entry[1] += event.dur
    else:
        tid, tids = device.tid, device.tids
        devices, device_code = np.unique(device.device, return_inverse=True)
        keys, group = np.unique(device_code.ravel() * max(len(tids), 1) + tid, return_inverse=True)
        group = group.ravel()
        counts = np.bincount(group, minlength=keys.size)
        sums = np.bincount(group, weights=device.dur, minlength=keys.size)
        present, first = np.unique(group, return_index=True)
        for g in present[np.argsort(first, kind="stable")].tolist():
            code, stream = divmod(int(keys[g]), max(len(tids), 1))
            totals[(int(devices[code]), tids[stream])] = [int(counts[g]), float(sums[g])]
    return [{"device": device, "stream": stream, "events": count, "busy_us": busy}
            for (device, stream), (count, busy) in sorted(totals.items(), key=lambda kv: -kv[1][1])]


#: Ops whose kernels are matmuls or convolutions: a kernel whose name says nothing of its math is judged by the
#: launching op's input dtype (``record_shapes``): 16-bit or 8-bit floats run on Tensor Cores.
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::_grouped_mm",
              "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::matmul", "aten::linear")
TENSOR_CORE_DTYPES = ("c10::bfloat16", "c10::half", "bfloat16", "half", "c10::float8_e4m3fn", "c10::float8_e5m2",
                      "c10::float8_e4m3fnuz", "c10::float8_e5m2fnuz")


def _matmul_dtypes(trace: Trace) -> dict[Any, str]:
    """External id of each matmul/conv op -> its first input's dtype (lower case), where it was recorded."""
    found: dict[Any, str] = {}
    ops = trace.columns("cpu_ops")
    memo: dict[bytes, Any] = {}
    for op in ops.take(ops.named(trace.names("cpu_ops", MATMUL_OPS)) & (ops.external_id != ABSENT)):
        if op.external_id is not None:
            types = op.input_type_as(memo)
            if types:
                found[op.external_id] = str(types[0]).lower()
    return found


def tensor_core_use(trace: Trace) -> dict[str, Any]:
    """Share of compute-kernel time on Tensor Cores, TF32 told apart, judged from kernel names and, where a name
    says nothing, the launching op's input dtype."""
    kernels = trace.columns("kernels")
    op_dtypes = _matmul_dtypes(trace)
    kinds = ("tf32", "tensor_core", "fp32_simt", "other")
    math = np.asarray([kinds.index(kernel_math(name or "")) for name in kernels.names] or [0], dtype=np.int64)
    math = math[kernels.name]
    if op_dtypes:  # a kernel whose name says nothing, launched by a matmul on 16- or 8-bit inputs
        tensor_ids = [ext for ext, dtype in op_dtypes.items() if dtype in TENSOR_CORE_DTYPES]
        math[(math == 3) & np.isin(kernels.external_id, np.asarray(tensor_ids, dtype=np.int64))] = 1
    compute = ~communication_kernels(trace)
    sums = np.bincount(math[compute], weights=kernels.dur[compute], minlength=4)
    time = dict(zip(kinds, sums.tolist(), strict=True))
    total = sum(time.values())
    tf32, tensor, simt = time["tf32"], time["tf32"] + time["tensor_core"], time["fp32_simt"]
    if not total:
        return {}
    return {"tensor_core_share": tensor / total, "tf32_share": tf32 / total, "fp32_simt_gemm_share": simt / total,
            "compute_kernel_us": total}


def attention_kernels(trace: Trace) -> dict[str, float]:
    """Time (µs) per attention implementation: ``flash``, ``memory_efficient``, ``cudnn`` from kernel names
    (or from op names on a CPU trace), ``math`` and ``unfused`` (softmax between batched matmuls)."""

    found: dict[str, float] = {
        kind: total for kind, (_, total) in grouped_totals(trace.columns("kernels"), lambda n: attention_kind(n or ""),
                                                           ).items() if kind is not None}
    on_device = trace.has_gpu
    softmax_ops, bmm_ops, slow_ops = [], [], []
    ops = trace.columns("cpu_ops")
    for op in ops.take(ops.named((*ATTENTION_OPS, *ATTENTION_OPS_CPU, *SOFTMAX_OPS, *BATCHED_MATMUL_OPS))):
        name = op.name or ""
        kind = ATTENTION_OPS.get(name) or ATTENTION_OPS_CPU.get(name)
        if kind in ("math", "unfused"):
            slow_ops.append((kind, op))
        elif kind is not None and not on_device:
            found[kind] = found.get(kind, 0.0) + op.dur
        elif name in SOFTMAX_OPS and _attention_shaped(op):
            softmax_ops.append(op)
        elif name in BATCHED_MATMUL_OPS:
            bmm_ops.append(op)
    for kind in ("math", "unfused"):
        ops = [op for k, op in slow_ops if k == kind]
        if ops:  # on a GPU, the device time of everything launched inside the op, not its host time
            found[kind] = found.get(kind, 0.0) + _time_of(trace, ops, on_device)
    if softmax_ops and bmm_ops and not any(found.get(k) for k in ("flash", "memory_efficient", "cudnn", "math")):
        # attention written out by hand (nn.MultiheadAttention with need_weights=True): everything from the scores'
        # matmul to the one that applies them, forward and backward (the scaling, the mask, the softmax, the
        # dropout, the transposes: what SDPA replaces), or the matmuls and softmaxes alone where no span is found
        core = attention_core_spans(softmax_ops, bmm_ops)
        found["unfused"] = found.get("unfused", 0.0) + (_time_of(trace, core, on_device) if core else
                                                        _time_of(trace, softmax_ops + bmm_ops, on_device))
    return found


#: Operators that mask attention scores, and those that drop them out, when seen between the scores' matmul and
#: the one that applies them.
MASK_OPS = ("aten::masked_fill", "aten::masked_fill_", "aten::where", "aten::_masked_softmax")
DROPOUT_OPS = ("aten::dropout", "aten::native_dropout", "aten::bernoulli_", "aten::feature_dropout")
#: A core span may be at most this many times its three operators' own time (else the matmuls found are not the
#: attention's: the softmax is left alone).
CORE_SPAN_BOUND = 50.0


def attention_core_spans(softmax_ops: list[Any], matmul_ops: list[Any]) -> list[Any]:
    """For each attention-shaped softmax, the span on its thread from the last batched matmul that ended before
    it to the first that starts after it (in the backward, the last two and the first two: each matmul's backward
    is two): the attention's core, which SDPA replaces, as events (``cpu_op`` named ``attention core``). Spans that
    overlap are merged; a softmax without the matmuls each side (or whose span is far longer than its operators)
    gives none."""
    by_thread: dict[Any, list[Any]] = {}
    for op in matmul_ops:
        by_thread.setdefault((op.pid, op.tid), []).append(op)
    for ops in by_thread.values():
        ops.sort(key=lambda op: op.ts)
    starts = {thread: [op.ts for op in ops] for thread, ops in by_thread.items()}
    found_spans: dict[Any, list[tuple[float, float]]] = {}
    for softmax in softmax_ops:
        thread = (softmax.pid, softmax.tid)
        ops = by_thread.get(thread)
        if not ops:
            continue
        end = softmax.ts + softmax.dur
        after = bisect.bisect_left(starts[thread], end)
        before = bisect.bisect_right(starts[thread], softmax.ts) - 1
        while before >= 0 and ops[before].ts + ops[before].dur > softmax.ts:
            before -= 1  # the matmul that ended before the softmax began (a nested one is not it)
        side = 2 if "backward" in (softmax.name or "") else 1
        if before - side + 1 < 0 or after + side - 1 >= len(ops):
            continue
        around = ops[before - side + 1:before + 1] + ops[after:after + side]
        low, high = around[0].ts, around[-1].ts + around[-1].dur
        if high - low > CORE_SPAN_BOUND * (softmax.dur + sum(op.dur for op in around)):
            continue
        found_spans.setdefault(thread, []).append((low, high))
    return [Event(cat="cpu_op", name="attention core", ts=low, dur=high - low, pid=thread[0], tid=thread[1])
            for thread, found in found_spans.items() for low, high in spans.merge(found)]


def attention_core(trace: Trace) -> dict[str, Any]:
    """What the hand-written attention's core holds, for its fix: ``{spans, masked, dropout}``; ``masked``: a
    mask is applied to the scores (``masked_fill``, ``where``); ``dropout``: the probabilities are dropped out in
    training. Empty where no core span is found."""
    ops = trace.columns("cpu_ops")
    softmax = [op for op in ops.take(ops.named(SOFTMAX_OPS)) if _attention_shaped(op)]
    matmuls = ops.take(ops.named(BATCHED_MATMUL_OPS))
    core = attention_core_spans(softmax, matmuls)
    if not core:
        return {}
    bounds = sorted((span.pid, span.tid, span.ts, span.ts + span.dur) for span in core)

    def inside(names: tuple[str, ...], keep: Any = lambda op: True) -> bool:
        return any(lo <= op.ts < hi for op in ops.take(ops.named(names)) if keep(op)
                   for pid, tid, lo, hi in bounds if (op.pid, op.tid) == (pid, tid))

    return {"spans": len(core), "masked": inside(MASK_OPS), "dropout": inside(DROPOUT_OPS, drops)}


def drops(op: Any) -> bool:
    """A dropout op that drops something: its recorded probability (``record_shapes``' concrete inputs: input, p,
    train) is above 0 and it trains; one recorded with p 0 or train False returns its input (HF's eager attention
    calls dropout with the config's ``attention_dropout``, 0.0 by default). Unrecorded: it may."""
    concrete = op.a.concrete_inputs or []
    if op.name == "aten::bernoulli_" or len(concrete) < 2 or concrete[1] in ("", None):
        return True
    try:
        p = float(concrete[1])
    except (TypeError, ValueError):
        return True
    train = str(concrete[2]).lower() if len(concrete) > 2 else "true"
    return p > 0 and train != "false"


def _time_of(trace: Trace, ops: list[Any], on_device: bool) -> float:
    """µs of ``ops``: the device time of what they launched on a GPU trace, their host time (nested ops, such as
    ``aten::softmax`` around ``aten::_softmax``, counted once) on a CPU trace."""
    if on_device:
        return device_time_inside(trace, ops)
    by_thread: dict[Any, list[tuple[float, float]]] = {}
    for op in ops:
        by_thread.setdefault((op.pid, op.tid), []).append((op.ts, op.ts + op.dur))
    return sum(spans.total(spans.merge(found)) for found in by_thread.values())


#: The op SDPA's math path runs as; its arguments are SDPA's own: q, k, v, attn_mask, dropout_p, is_causal, ...
SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"


def sdpa_math_inputs(trace: Trace) -> dict[str, Any]:
    """What the SDPA calls that ran the math path were given (from ``record_shapes``): ``calls``, the largest
    ``dropout_p``, the query ``dtypes`` and ``head_dims``, whether q/k/v head dims differ, calls with an
    ``attn_mask`` and ``is_causal`` ones. Empty when no such call was recorded."""
    calls = masked = causal = 0
    dropout = 0.0
    dtypes: set[str] = set()
    head_dims: set[int] = set()
    differ = False
    ops = trace.columns("cpu_ops")
    for op in ops.take(ops.named((SDPA_MATH_OP,))):
        calls += 1
        dims = op.input_dims or []
        types = op.a.input_type or []
        concrete = op.a.concrete_inputs or []
        last = [shape[-1] for shape in dims[:3] if isinstance(shape, list) and shape]
        if last:
            head_dims.add(int(last[0]))
            differ = differ or len(set(last)) > 1
        if types and types[0]:
            dtypes.add(str(types[0]).replace("c10::", "").lower())
        if len(dims) > 3 and isinstance(dims[3], list) and dims[3]:
            masked += 1
        with contextlib.suppress(TypeError, ValueError):
            dropout = max(dropout, float(concrete[4])) if len(concrete) > 4 and concrete[4] else dropout
        if len(concrete) > 5 and str(concrete[5]).lower() == "true":
            causal += 1
    if not calls:
        return {}
    return {"calls": calls, "dropout_p": dropout, "dtypes": sorted(dtypes), "head_dims": sorted(head_dims),
            "head_dims_differ": differ, "masked": masked, "causal": causal}


def _attention_shaped(softmax: Any) -> bool:
    """A softmax over attention scores: its input is [batch, heads, queries, keys] or [batch*heads, queries,
    keys] (recorded with ``record_shapes``). A router's softmax over experts ([tokens, experts]) is not; without
    shapes it cannot be told, and is not taken for attention."""
    dims = softmax.input_dims
    first = dims[0] if isinstance(dims, list) and dims else None
    return isinstance(first, list) and len(first) >= 3 and all(isinstance(d, int) and d > 1 for d in first[-2:])


#: A launch call longer than this (µs), and 50x the median launch, loads a module or code object at the kernel's
#: first launch: one-time start-up work, not the launch rate (a launch takes a few µs).
ONE_TIME_CALL_US = 1000.0
#: Runtime calls that set a process up (context, streams, events, modules) and cost nothing in the steady state.
SETUP_CALLS = ("cudaStreamCreate", "cudaEventCreate", "cudaFree", "cuModuleLoad", "cudaGetDeviceProperties",
               "cudaDeviceGetStreamPriorityRange", "hipDeviceGetStreamPriorityRange",  # the first call: context init
               "cudaDeviceGetAttribute", "hipStreamCreate", "hipEventCreate", "hipFree", "hipModuleLoad",
               "cudaFuncGetAttributes", "cuModuleGetFunction", "hipModuleGetFunction")


def one_time_bound(durations: np.ndarray) -> float:
    """The duration (µs) past which a launch call is one-time loading rather than a launch, from the launch calls'
    durations (µs)."""
    return max(ONE_TIME_CALL_US, 50 * float(np.median(durations))) if durations.size else ONE_TIME_CALL_US


def launch_calls(trace: Trace) -> np.ndarray:
    """The rows of ``trace.columns("runtimes")`` that launch (``Launch`` in the name)."""
    return trace.columns("runtimes").name_mask(lambda name: "Launch" in (name or ""))


def startup_calls(trace: Trace) -> list[Any]:
    """The runtime calls that are one-time start-up work (see :func:`startup_work`); computed once per trace."""
    cached = trace.__dict__.get("_startup_calls")
    if cached is not None:
        return cached
    runtimes = trace.columns("runtimes")
    launches = launch_calls(trace)
    bound = one_time_bound(runtimes.dur[launches])
    found = runtimes.take(launches & (runtimes.dur > bound))
    found += runtimes.take(runtimes.named(trace.names("runtimes", SETUP_CALLS)) & (runtimes.dur > ONE_TIME_CALL_US))
    trace.__dict__["_startup_calls"] = found
    return found


def startup_work(trace: Trace, window: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """One-time start-up work in the trace: launch calls past :func:`one_time_bound` (a module or code object
    loaded at first launch) and set-up calls (streams, events, modules, ``cudaFree``) longer than
    :data:`ONE_TIME_CALL_US`. ``{calls, time_us, share (of the window), by_name}``; empty when there is none."""
    found = startup_calls(trace)
    if not found:
        return {}
    by_name: dict[str, float] = {}
    for call in found:
        by_name[call.name or "?"] = by_name.get(call.name or "?", 0.0) + call.dur
    time_us = spans.measure(spans.union(spans.of_events(found)), window) if window else sum(by_name.values())
    length = spans.total(window) if window else 0.0
    return {"calls": len(found), "time_us": time_us, "share": time_us / length if length else None,
            "by_name": dict(sorted(by_name.items(), key=lambda item: -item[1])[:5])}


def launch_statistics(trace: Trace, steps: int, window: list[tuple[float, float]] | None = None
                      ) -> dict[str, float]:
    """Kernels per step, share of kernels shorter than 10 µs, median launch-to-start gap (µs), and
    ``launch_call_share``: the fraction 0..1 of the steps' time the host spent inside launch calls
    (``cudaLaunchKernel``, ``cuLaunchKernel``, ``hipLaunchKernel``, graph launches; not copies or syncs)."""
    if not trace.kernels:
        return {}
    launch_call_share = None
    runtimes = trace.columns("runtimes")
    calls = launch_calls(trace)
    bound = one_time_bound(runtimes.dur[calls])
    if window:
        length = spans.total(window)
        if length > 0:
            typical = calls & (runtimes.dur <= bound)  # one-time loading is not the launch rate
            launch_call_share = spans.measure(spans.union((runtimes.ts[typical], runtimes.end[typical])),
                                              window) / length
    kernels = trace.columns("kernels")
    short = int(np.count_nonzero(kernels.dur < SHORT_KERNEL_US))
    gaps = launch_gaps(trace, np.ones(len(kernels), dtype=bool))
    return {
        "kernels_per_step": len(trace.kernels) / max(steps, 1),
        "short_kernel_share": short / len(trace.kernels),
        "median_launch_to_start_us": float(np.median(gaps)) if gaps.size else None,
        "launch_call_share": launch_call_share,
    }


def launch_times(trace: Trace, correlations: np.ndarray) -> np.ndarray:
    """The host time (µs) of the runtime call that launched each correlation id (the last such call, as
    :func:`~perfhooks.analysis.overview.launch_table`); NaN where none did."""
    ids, times = launch_table(trace)
    out = np.full(correlations.size, np.nan)
    if ids.size:
        slot = np.minimum(np.searchsorted(ids, correlations), ids.size - 1)
        found = ids[slot] == correlations
        out[found] = times[slot[found]]
    return out


def launch_gaps(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Launch-to-start gaps (µs) of the kernels at ``rows`` (a mask) that have a launch, in row order."""
    kernels = trace.columns("kernels")
    launched = launch_times(trace, kernels.correlation[rows])
    starts = kernels.ts[rows]
    found = ~np.isnan(launched)
    return starts[found] - launched[found]
