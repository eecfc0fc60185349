"""Issue 77: the host waits in a device synchronize far longer than any device work the trace records. The wait's
unexplained part is device work the trace does not show (graph replays, another process, a clock offset), not an
idle GPU: utilization is judged without it, no verdict comes from it, and the report says it. Both shapes of the
two held-out traces misread for three rounds, built here event by event (checked by hand in each test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_misreadings import attention_burst, kernel, write_trace, x

from perfhooks.offline.analyze import analyze_paths

FLASH = "aten::_scaled_dot_product_flash_attention"

MI300X = [{"id": 0, "name": "AMD Instinct MI300X"}]


def burst_then_sync_trace(tmp_path: Path) -> Path:
    """A short inference capture on an MI300X, no step markers: 10 attention operators launched 10 µs apart from
    1 ms, their kernels of 108 µs running 137 µs apart from 1.015 ms (1.08 ms busy in a 1.341 ms burst); the host
    calls torch.cuda.synchronize at 1.12 ms, while the burst runs, and sits 323.6 ms in hipDeviceSynchronize with no
    device activity recorded after the burst; the script's next line, then the profiler's exit 335 ms later."""
    events = [x("python_function", "infer.py(12): <module>", 0.0, 659_000.0),
              x("python_function", "torch/profiler/profiler.py(790): __enter__", 0.0, 300.0)]
    events += attention_burst(FLASH, ops=(1_000.0, 10.0, 8.0), launch=(2.0, 5.0), kernels=(1_015.0, 137.0, 108.0))
    events.append(x("python_function", "torch/cuda/__init__.py(1040): synchronize", 1_120.0, 323_610.0))
    events.append(x("cuda_runtime", "hipDeviceSynchronize", 1_125.0, 323_600.0))
    events.append(x("python_function", "infer.py(13): <module>", 324_800.0, 50.0))
    events.append(x("python_function", "torch/profiler/profiler.py(801): __exit__", 659_730.0, 400.0))
    return write_trace(tmp_path, events, name="burst_sync.json", devices=MI300X)


def test_a_burst_followed_by_a_long_sync_reads_the_bursts_utilization(tmp_path: Path) -> None:
    path = burst_then_sync_trace(tmp_path)
    raw = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in raw if e["cat"] == "kernel"]
    busy = sum(k["dur"] for k in kernels)
    device_end = max(k["ts"] + k["dur"] for k in kernels)
    sync = next(e for e in raw if e["name"] == "hipDeviceSynchronize")
    assert (busy, device_end, sync["ts"] + sync["dur"]) == (1_080.0, 2_356.0, 324_725.0)  # by hand
    report = analyze_paths([path])
    metrics = report["metrics"]
    unrecorded = metrics["unrecorded"]
    assert unrecorded["syncs"] == 1 and unrecorded["unrecorded_us"] == pytest.approx(324_725.0 - 2_356.0)
    assert unrecorded["device_us"] == pytest.approx(9 * 108.0)  # the kernels that ran inside the wait
    # the window runs from the first operator to the synchronize frame's return (323.73 ms); less the unrecorded
    # wait it is 1.361 ms, the burst and the host work around it
    assert metrics["step_us"] == pytest.approx(324_730.0 - 1_000.0)
    assert metrics["gpu_utilization"] == pytest.approx(1_080.0 / (324_730.0 - 1_000.0 - (324_725.0 - 2_356.0)))
    assert metrics["gpu_utilization"] > 0.78  # before: 0.3%, critical, "saves at most 100% of the step"
    ids = {d["id"]: d for d in report["diagnoses"]}
    assert "low_gpu_utilization" not in ids
    finding = ids["unrecorded_device_work"]
    assert (finding["severity"], finding["estimated_gain"]) == ("info", 0)
    assert ("the host waited 323.6 ms in 1 device synchronize(s) while the trace records 1.0 ms of device work in "
            "them") in finding["evidence"]
    assert "graph replays, another process" in finding["evidence"]


def captures_then_syncs_trace(tmp_path: Path) -> Path:
    """A vLLM-like piecewise capture on ROCm, no step markers: 25 rounds of 7 ms, each a stream capture of 1.9 ms
    (20 launches recorded, nothing run), an eager kernel of 33.6 µs launched at 1.95 ms, and a hipDeviceSynchronize
    from 2.0 ms to 6.6 ms (the kernel ran 1.96 to 1.99 ms: nothing recorded in the wait); then one more sync that
    returns at once."""
    events, correlation = [x("cpu_op", "capture_model", 0.0, 175_000.0)], 0
    for round_ in range(25):
        t = round_ * 7_000.0
        events.append(x("cuda_runtime", "hipStreamBeginCapture", t, 10.0))
        for index in range(20):
            correlation += 1
            events.append(x("cuda_runtime", "hipLaunchKernel", t + 20.0 + index * 80.0, 5.0, correlation=correlation))
        events.append(x("cuda_runtime", "hipStreamEndCapture", t + 1_890.0, 10.0))
        correlation += 1
        events.append(x("cuda_runtime", "hipLaunchKernel", t + 1_950.0, 5.0, correlation=correlation))
        events.append(kernel("Cijk_Ailk_Bljk_BBS_BH", t + 1_960.0, 33.6, correlation))
        events.append(x("cuda_runtime", "hipDeviceSynchronize", t + 2_000.0, 4_600.0))
    events.append(x("cuda_runtime", "hipDeviceSynchronize", 174_990.0, 5.0))
    return write_trace(tmp_path, events, name="captures_syncs.json", devices=MI300X)


def test_captures_each_followed_by_a_long_sync_get_no_utilization_verdict(tmp_path: Path) -> None:
    path = captures_then_syncs_trace(tmp_path)
    raw = json.loads(path.read_text())["traceEvents"]
    syncs = [e for e in raw if e["name"] == "hipDeviceSynchronize"]
    kernels = [e for e in raw if e["cat"] == "kernel"]
    assert (len(syncs), sum(s["dur"] for s in syncs), sum(k["dur"] for k in kernels)) == (26, 115_005.0,
                                                                                      pytest.approx(840.0))
    assert not [k for k in kernels for s in syncs if s["ts"] <= k["ts"] < s["ts"] + s["dur"]]  # by hand
    report = analyze_paths([path])
    metrics = report["metrics"]
    assert metrics["unrecorded"]["syncs"] == 25  # the last one returned at once: nothing to wait for
    assert metrics["unrecorded"]["unrecorded_us"] == pytest.approx(25 * 4_600.0)
    ids = {d["id"]: d for d in report["diagnoses"]}
    assert "low_gpu_utilization" not in ids  # before: critical (0.6%), "raise the work per step"
    assert "graph_capture_in_window" in ids
    finding = ids["unrecorded_device_work"]
    assert "the host waited 115.0 ms in 25 device synchronize(s) while the trace records 0.0 ms" in \
        finding["evidence"]
    assert finding["measured"]["unrecorded_share"] == pytest.approx(115_000.0 / metrics["step_us"], abs=0.01)


def test_a_sync_that_waits_on_recorded_work_is_not_unrecorded(tmp_path: Path) -> None:
    """The common case: a training step's synchronize waits on kernels the trace records; nothing is said."""
    events = [x("cpu_op", "forward", 0.0, 10_000.0)]
    for index in range(10):
        t = index * 100.0
        events.append(x("cuda_runtime", "cudaLaunchKernel", t, 5.0, correlation=index + 1))
        events.append(kernel("ampere_bf16_s16816gemm", 10.0 + index * 2_000.0, 1_990.0, index + 1))
    events.append(x("cuda_runtime", "cudaDeviceSynchronize", 1_000.0, 19_005.0))
    report = analyze_paths([write_trace(tmp_path, events, name="recorded.json")])
    assert report["metrics"]["unrecorded"] == {}
    assert "unrecorded_device_work" not in {d["id"] for d in report["diagnoses"]}


def python_sync_tail_trace(tmp_path: Path) -> Path:
    """Issue 84, from the held-out trace's raw events: a short SDPA capture on an MI300X with no ProfilerStep.
    ``run_case`` calls ``torch/cuda/__init__.py: synchronize`` (323.65 ms) at 0.35 ms; inside it the built-in
    ``_cuda_synchronize`` (323.63 ms), and inside that ``hipDeviceSynchronize``, which lasts only 1.42 ms (0.40 to
    1.82 ms). The 10 attention kernels (108 µs each, 1.08 ms in all) run from 0.50 to 1.87 ms, inside the runtime
    call; after it returns the host stays 322 ms inside ``_cuda_synchronize`` with no child, no runtime call and no
    device activity. The profiler stops 335 ms later."""
    events = [x("python_function", "run_case.py(40): run_case", 0.0, 324_100.0),
              x("python_function", "torch/profiler/profiler.py(790): __enter__", 0.0, 50.0)]
    events += attention_burst(FLASH, ops=(60.0, 20.0, 15.0), launch=(3.0, 8.0), kernels=(500.0, 137.0, 108.0))
    events.append(x("python_function", "torch/cuda/__init__.py(1040): synchronize", 350.0, 323_650.0))
    events.append(x("python_function", "<built-in method _cuda_synchronize of PyCapsule object at 0x7f>", 360.0,
                    323_630.0))
    events.append(x("cuda_runtime", "hipDeviceSynchronize", 400.0, 1_420.0))
    events.append(x("python_function", "torch/profiler/profiler.py(801): __exit__", 659_000.0, 400.0))
    return write_trace(tmp_path, events, name="python_sync_tail.json", devices=MI300X)


def test_a_python_synchronize_that_outlasts_its_device_call_is_the_hosts_time_not_idle_device(tmp_path: Path
                                                                                                 ) -> None:
    path = python_sync_tail_trace(tmp_path)
    raw = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in raw if e["cat"] == "kernel"]
    call = next(e for e in raw if e["name"] == "hipDeviceSynchronize")
    frame = next(e for e in raw if e["name"].startswith("<built-in method _cuda_synchronize"))
    device_end = max(k["ts"] + k["dur"] for k in kernels)
    assert (sum(k["dur"] for k in kernels), device_end, call["ts"] + call["dur"]) == (1_080.0, 1_841.0, 1_820.0)
    assert frame["ts"] + frame["dur"] - device_end == pytest.approx(322_149.0)  # by hand: the bare tail
    report = analyze_paths([path])
    metrics = report["metrics"]
    assert metrics["unrecorded"] == {}  # the runtime call is short: nothing unrecorded waited for
    tail = metrics["sync_tail"]
    assert tail["frames"] == 1 and tail["tail_us"] == pytest.approx(324_000.0 - 1_841.0)  # the outer frame's end
    judged = metrics["step_us"] - tail["tail_us"]
    assert metrics["gpu_utilization"] == pytest.approx(1_080.0 / judged)
    assert metrics["gpu_utilization"] > 0.5  # before: 0.3%, critical, "raise the work per step"
    ids = {d["id"]: d for d in report["diagnoses"]}
    assert "low_gpu_utilization" not in ids
    assert not [d for d in report["diagnoses"] if d["severity"] == "critical"]
    assert not [d for d in report["diagnoses"] if "work per step" in d["recommendation"]]
    said = ids["host_after_sync"]
    assert (said["severity"], said["estimated_gain"]) == ("info", 0)
    assert "the host stayed 322.2 ms inside 1 synchronize frame(s) after their device call returned" in \
        said["evidence"]
    # the burst's own utilization is reported: 1.08 ms busy from 0.50 to 1.841 ms
    assert tail["device_busy_share"] == pytest.approx(1_080.0 / 1_341.0, abs=1e-4)
    assert "the device's recorded work is 1.08 ms, 80.5% busy over its 1.34 ms" in said["evidence"]


def test_a_synchronize_frame_with_work_after_its_call_is_not_a_bare_tail(tmp_path: Path) -> None:
    events = [x("python_function", "torch/cuda/__init__.py(1040): synchronize", 0.0, 50_000.0),
              x("cuda_runtime", "hipDeviceSynchronize", 10.0, 1_000.0),
              x("cpu_op", "aten::copy_", 2_000.0, 40_000.0),
              x("cuda_runtime", "hipLaunchKernel", 2_010.0, 8.0, correlation=1), kernel("k", 2_030.0, 100.0, 1)]
    report = analyze_paths([write_trace(tmp_path, events, name="busy_after.json", devices=MI300X)])
    assert report["metrics"]["sync_tail"] == {}
