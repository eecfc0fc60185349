"""The TensorBoard plugin's overview figures, checked against the plugin itself and pinned per trace."""

from __future__ import annotations

import pytest

from fixtures import RESNET, report, tb_reference

ROLE_NAMES = {"Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset", "Communication": "communication",
              "Runtime": "runtime", "DataLoader": "dataloader", "CpuOp": "cpu_exec", "Other": "other"}


@pytest.mark.parametrize("name", RESNET)
def test_resnet_agrees_with_the_tensorboard_plugin_within_one_point(name: str) -> None:
    reference = tb_reference()[f"tb_plugin/{name}"]
    metrics = report(name)["metrics"]
    assert metrics["steps"] == reference["steps"]
    assert metrics["gpu_utilization"] == pytest.approx(reference["gpu_utilization"]["0"], abs=0.01)
    assert metrics["sm_efficiency"] == pytest.approx(reference["sm_efficiency"]["0"], abs=0.01)
    assert metrics["achieved_occupancy"] == pytest.approx(reference["occupancy"]["0"], abs=1.0)
    total = reference["avg_costs_us"]["Total"]
    assert metrics["step_us"] == pytest.approx(total, rel=0.01)
    for role, ours in ROLE_NAMES.items():
        theirs = reference["avg_costs_us"][role] / total
        assert metrics["breakdown"][ours] / metrics["step_us"] == pytest.approx(theirs, abs=0.01), role


@pytest.mark.parametrize(("name", "steps", "utilization", "sm", "occupancy"), [
    # occupancy of the compute kernels: its 21 NCCL kernels (occupancy 0 by design) took it to 35.31
    ("a100_nccl_rank0_of2.json.gz", 3, 0.2326, 0.1687, 49.63),
    ("v100_ns_resolution.pt.trace.json.gz", 5, 0.9683, 0.9492, 46.45),
    ("mi250_minitoy_train.json.gz", 1, 0.0119, None, None),
])
def test_pinned_gpu_metrics(name: str, steps: int, utilization: float, sm: float | None,
                            occupancy: float | None) -> None:
    metrics = report(name)["metrics"]
    assert metrics["steps"] == steps
    assert metrics["gpu_utilization"] == pytest.approx(utilization, abs=1e-3)
    assert metrics["sm_efficiency"] == (None if sm is None else pytest.approx(sm, abs=1e-3))
    assert metrics["achieved_occupancy"] == (None if occupancy is None else pytest.approx(occupancy, abs=0.01))


def test_breakdown_covers_the_step_exactly() -> None:
    for name in [*RESNET[:1], "a100_nccl_rank0_of2.json.gz"]:
        metrics = report(name)["metrics"]
        assert sum(metrics["breakdown"].values()) == pytest.approx(metrics["step_us"], rel=1e-9)


def test_temporal_and_idle_views() -> None:
    metrics = report(RESNET[0])["metrics"]
    temporal, idle = metrics["temporal"], metrics["idle"]
    assert temporal["idle"] + temporal["compute"] + temporal["non_compute"] == pytest.approx(1.0)
    assert temporal["compute"] == pytest.approx(metrics["gpu_utilization"], abs=0.01)
    assert idle["host_wait"] + idle["kernel_wait"] + idle["other"] == pytest.approx(1.0)
    assert idle["host_wait"] > 0.9, "the num_workers=0 GPU mostly waits for the host to load data"


def test_kernel_and_operator_breakdowns() -> None:
    metrics = report(RESNET[0])["metrics"]
    top = metrics["kernels"]["top"]
    assert top[0]["name"].startswith("void cudnn::detail::dgrad_engine")
    assert top[0]["share"] == pytest.approx(0.137, abs=0.005)
    assert [k["total_us"] for k in top] == sorted((k["total_us"] for k in top), reverse=True)
    operators = metrics["top_operators"]
    assert operators and operators[0]["device_self_us"] >= operators[-1]["device_self_us"]
    assert any(op["input_shapes"] for op in operators), "input shapes are kept when recorded"


def test_launch_statistics_and_memcpy_direction() -> None:
    metrics = report(RESNET[0])["metrics"]
    assert metrics["launch"]["kernels_per_step"] == pytest.approx(8772 / 6, rel=0.01)
    assert 0.5 < metrics["launch"]["short_kernel_share"] < 0.8
    assert metrics["launch"]["median_launch_to_start_us"] > 0
    assert metrics["memcpy"]["pageable_share"] == 1.0
    assert set(metrics["memcpy"]["by_direction"]) == {"HtoD"}


def _events(name: str) -> dict:
    import gzip
    import json

    from fixtures import path

    return json.loads(gzip.decompress(path(name).read_bytes()))


def test_a_window_without_step_markers_ends_with_the_device_work_it_launched() -> None:
    """SGLang inference, no ProfilerStep: from the first operator or runtime call (the window's activity: the
    Python frames before it are the capture's lead-in, issue 66) to the end of the last kernel launched from the
    host window (the plugin's rule), computed here from the raw events."""
    document = _events("tl_sglang_qwen3_prefilldecode.json.gz")
    complete = [e for e in document["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    host = [e for e in complete if e.get("cat") in ("cpu_op", "python_function", "user_annotation", "cuda_runtime",
                                                     "cuda_driver")]
    start = min(e["ts"] for e in host if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")
                and not e["name"].endswith("Synchronize"))
    host_end = max(e["ts"] + e["dur"] for e in host)
    launched = {e["args"]["correlation"] for e in host if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    device_end = max(e["ts"] + e["dur"] for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                     and e.get("args", {}).get("correlation") in launched)
    metrics = report("tl_sglang_qwen3_prefilldecode.json.gz")["metrics"]
    assert metrics["step_rule"] == "host_window"
    assert metrics["step_us"] == pytest.approx(max(host_end, device_end) - start, rel=1e-6)
    assert device_end > host_end  # the case the rule is for: the GPU was still working when the host stopped
    assert metrics["gpu_utilization"] == pytest.approx(0.499, abs=0.002)


def test_a_gpu_only_trace_is_one_step_over_its_device_activity(tmp_path) -> None:
    """A trace with device events only (ProfilerActivity.CUDA alone): the real ResNet-50 trace with its host
    side removed is analysed as a GPU run, with utilization = kernel busy time ÷ first-to-last device span."""
    import gzip
    import json

    from perfhooks.offline.analyze import analyze_paths

    document = _events("resnet50_num_workers_4.worker0.1623212756351.pt.trace.json.gz")
    device = [e for e in document["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("Kernel", "Memcpy", "Memset")]
    document["traceEvents"] = [e for e in document["traceEvents"] if e.get("ph") != "X"] + device
    trace = tmp_path / "gpu_only.json.gz"
    trace.write_bytes(gzip.compress(json.dumps(document).encode()))
    result = analyze_paths([trace])
    first = min(e["ts"] for e in device)
    last = max(e["ts"] + e["dur"] for e in device)
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in device if e["cat"] == "Kernel")
    busy, reach = 0.0, float("-inf")
    for begin, end in kernels:
        busy += max(0.0, end - max(begin, reach))
        reach = max(reach, end)
    assert result["metrics"]["step_rule"] == "device_only"
    assert result["device"]["type"] == "cuda"
    assert result["metrics"]["step_us"] == pytest.approx(last - first)
    assert result["metrics"]["gpu_utilization"] == pytest.approx(busy / (last - first), rel=1e-6)
