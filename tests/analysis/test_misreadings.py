"""Issue 28: the misreadings that other teams' traces expose, each shown on a trace built to show the pattern (the
raw events written here, checked by hand in the test) or on a real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfhooks.analysis.analyze import analyze_paths


def write_trace(tmp_path: Path, events: list[dict[str, Any]], name: str = "trace.json",
                devices: list[dict[str, Any]] | None = None) -> Path:
    path = tmp_path / name
    document: dict[str, Any] = {"traceEvents": events}
    if devices is not None:
        document["deviceProperties"] = devices
    path.write_text(json.dumps(document))
    return path


def x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}
    if args:
        event["args"] = args
    return event


def kernel(name: str, ts: float, dur: float, correlation: int, external: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"device": 0, "stream": 7, "correlation": correlation}
    if external is not None:
        args["External id"] = external
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": args}


H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132}]


# ----------------------------------------------------------------------------- 1. start-up launches
def startup_trace(tmp_path: Path) -> Path:
    """3 steps of 20 ms, each 1000 kernels of 4 µs launched in 0.5 µs (the host spends 2.5% of the steps in
    launches); in the first step, 2 launches take 8 ms each (a module loaded at the kernel's first launch) and a
    stream is created in 3 ms."""
    events, correlation = [], 0
    for step in range(3):
        start = step * 20_000.0
        events.append(x("user_annotation", f"ProfilerStep#{step + 1}", start, 20_000.0))
        t = start + 10.0
        if step == 0:
            events.append(x("cuda_runtime", "cudaStreamCreateWithPriority", t, 3_000.0))
            t += 3_000.0
        for index in range(1000):
            correlation += 1
            slow = step == 0 and index < 2
            duration = 8_000.0 if slow else 0.5
            events.append(x("cuda_runtime", "cudaLaunchKernel", t, duration, correlation=correlation))
            events.append(kernel("elementwise_kernel", t + duration + 1.0, 4.0, correlation))
            t += duration + 6.0
    return write_trace(tmp_path, events, devices=H100)


def test_start_up_launches_are_a_finding_of_their_own_not_launch_bound(tmp_path: Path) -> None:
    path = startup_trace(tmp_path)
    raw = json.loads(path.read_text())["traceEvents"]
    launches = [e["dur"] for e in raw if e["name"] == "cudaLaunchKernel"]
    assert sorted(launches)[-2:] == [8_000.0, 8_000.0] and sorted(launches)[len(launches) // 2] == 0.5  # by hand
    report = analyze_paths([path])
    ids = [d["id"] for d in report["diagnoses"]]
    assert "launch_bound" not in ids
    startup = report["metrics"]["startup"]
    assert startup["calls"] == 3 and startup["time_us"] == pytest.approx(19_000.0)
    assert startup["by_name"] == {"cudaLaunchKernel": 16_000.0, "cudaStreamCreateWithPriority": 3_000.0}
    [finding] = [d for d in report["diagnoses"] if d["id"] == "startup_in_window"]
    assert finding["severity"] == "info" and finding["estimated_gain"] == 0
    assert "skip_first" in finding["recommendation"]
    # the launch rate is judged on the typical launch: 2998 calls of 0.5 µs, 1.5 ms in a window of 60 ms or more
    # (with the two loads, 17.5 ms: over a quarter of it)
    assert report["metrics"]["launch"]["launch_call_share"] <= 2998 * 0.5 / 60_000.0


# ----------------------------------------------------------------------------- 3. a device perfhooks does not model
def test_a_device_perfhooks_does_not_model_is_named_and_never_called_cpu(tmp_path: Path) -> None:
    events = [x("user_annotation", "ProfilerStep#1", 0.0, 1000.0), x("cpu_op", "aten::mm", 10.0, 50.0)]
    events += [x("mtia_ccp_events", "ccp_kernel", 100.0 + i, 1.0) for i in range(30)]
    events += [x("mtia_runtime", "mtiaLaunch", 50.0 + i, 0.5) for i in range(5)]
    report = analyze_paths([write_trace(tmp_path, events)])
    assert report["device"]["type"] == "unknown" and "mtia_ccp_events" in report["device"]["name"]
    assert any("mtia_ccp_events (30), mtia_runtime (5)" in warning for warning in report["warnings"])


def test_a_cpu_trace_is_still_cpu(tmp_path: Path) -> None:
    events = [x("user_annotation", "ProfilerStep#1", 0.0, 1000.0), x("cpu_op", "aten::mm", 10.0, 50.0),
              x("Trace", "PyTorch Profiler (0)", 0.0, 2000.0)]
    report = analyze_paths([write_trace(tmp_path, events)])
    assert report["device"]["type"] == "cpu" and not any("not model" in w for w in report["warnings"])


# ----------------------------------------------------------------------------- 4. kernels by evidence
KERNEL_MATH = [
    # GH200's cuBLAS FP32 GEMM: "xmma" is the family, f32f32...ffma says FP32 on the FMA units
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
     "kernel_trt", "fp32_simt"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel", "tf32"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     "tensor_core"),
    # H800 FP8 grouped GEMMs (DeepGEMM)
    ("void deep_gemm::fp8_gemm_kernel<128u, 128u, 128u, 4u, 1u, 8u, 1u, 128u, (deep_gemm::GemmType)1>(float*, int)",
     "tensor_core"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_kernel", "tensor_core"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)", "other"),
]


@pytest.mark.parametrize(("name", "math"), KERNEL_MATH, ids=[n[:30] for n, _ in KERNEL_MATH])
def test_kernel_math_from_the_names_dtype_tokens(name: str, math: str) -> None:
    from perfhooks.analysis.kernels import kernel_math

    assert kernel_math(name) == math


COMMUNICATION = [
    "void deep_ep::internode::combine<true, 8, 4096, 16, 2, 32>(int4*, float*)",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)",
    "void deep_ep::internode::notify_dispatch<true, 8>(int const*, int*)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)",
]


@pytest.mark.parametrize("name", COMMUNICATION, ids=[n[5:30] for n in COMMUNICATION])
def test_communication_libraries_kernels_are_communication(name: str) -> None:
    from perfhooks.analysis.overview import is_communication_kernel
    from perfhooks.analysis.trace import Event

    assert is_communication_kernel(Event(cat="kernel", name=name), set())


def test_a_gemm_whose_name_says_nothing_is_judged_by_its_ops_dtype(tmp_path: Path) -> None:
    """B300's bf16 nvjet GEMMs: no dtype token in the name; the launching aten::mm took bfloat16."""
    events = [x("user_annotation", "ProfilerStep#1", 0.0, 1000.0),
              x("cpu_op", "aten::mm", 10.0, 40.0, **{"External id": 7, "Input Dims": [[64, 64], [64, 64]],
                                                     "Input type": ["c10::BFloat16", "c10::BFloat16"]}),
              x("cuda_runtime", "cudaLaunchKernel", 20.0, 5.0, correlation=1, **{"External id": 7}),
              kernel("nvjet_sm103_tst_128x256_64x4_2x1_v_bz_coopA_TNT", 30.0, 500.0, 1, external=7)]
    metrics = analyze_paths([write_trace(tmp_path, events, devices=H100)])["metrics"]
    assert metrics["tensor_cores"]["tensor_core_share"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- 5. a router's softmax
def moe_trace(tmp_path: Path, scores: list[int]) -> Path:
    events = [x("user_annotation", "ProfilerStep#1", 0.0, 10_000.0)]
    t = 10.0
    for _ in range(20):
        events.append(x("cpu_op", "aten::_softmax", t, 200.0, **{"Input Dims": [scores, [], []]}))
        events.append(x("cpu_op", "aten::bmm", t + 250.0, 200.0, **{"Input Dims": [[8, 64, 32], [8, 32, 64]]}))
        t += 480.0
    return write_trace(tmp_path, events, name=f"moe{len(scores)}.json")


def test_a_routers_softmax_over_experts_is_not_attention(tmp_path: Path) -> None:
    """B300's MoE layer: softmax over [256 tokens, 2 experts] and the experts' batched matmuls."""
    router = analyze_paths([moe_trace(tmp_path, [256, 2])])
    assert "unfused" not in router["metrics"]["attention"]
    assert "unfused_attention" not in [d["id"] for d in router["diagnoses"]]
    scores = analyze_paths([moe_trace(tmp_path, [2, 4, 64, 64])])  # [batch, heads, queries, keys]: attention
    assert scores["metrics"]["attention"]["unfused"] > 0


# ----------------------------------------------------------------------------- 7. compiled code running
def test_compiled_code_running_is_not_compiling() -> None:
    from perfhooks.analysis.host import is_compilation

    assert not is_compilation("torch/_inductor/compile_fx.py(1702): run")
    assert not is_compilation("torch/_inductor/compile_fx.py(1498): wrapper")
    assert is_compilation("torch/_dynamo/convert_frame.py(1142): _compile")
    assert is_compilation("torch/_inductor/compile_fx.py(765): compile_fx_inner")


# ----------------------------------------------------------------------------- 6. ranks named
def rank_trace(tmp_path: Path, rank: int, kernel_us: float) -> Path:
    """One 10 ms step of rank ``rank`` whose kernels run ``kernel_us`` of it."""
    events = [x("user_annotation", "ProfilerStep#1", 0.0, 10_000.0),
              x("cuda_runtime", "cudaLaunchKernel", 10.0, 5.0, correlation=1),
              kernel("gemm_bf16_kernel", 20.0, kernel_us, 1)]
    path = tmp_path / f"rank{rank}.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": H100,
                                "distributedInfo": {"rank": rank, "world_size": 2}}))
    return path


def test_a_merged_verdict_names_the_rank_whose_figures_it_quotes(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0's kernels run 6 ms of its 10 ms step, rank 1's 2 ms: the low-utilization verdict is rank 1's
    figure (20%), and says so; the header says whose figures it shows."""
    from perfhooks.cli import main

    folder = tmp_path / "run"
    folder.mkdir()
    rank_trace(folder, 0, 6_000.0)
    rank_trace(folder, 1, 2_000.0)
    merged = analyze_paths([folder], workers=1)
    [verdict] = [d for d in merged["diagnoses"] if d["id"] == "low_gpu_utilization"]
    assert verdict["rank"] == 1 and verdict["evidence"].startswith("rank 1: ")
    assert "20.0%" in verdict["evidence"]  # 2 ms of 10 ms, by hand
    assert main(["analyze", str(folder)]) == 0
    assert "the figures below are rank 0's" in capsys.readouterr().out
