"""Issue 40, class 3: windows that are mostly start-up, capture or compilation are said to be so, and nothing steady is
judged from what is left. Each premise is computed here from the raw events with ``json``, not perfhooks' parser.

``recorded/cpu_compile_first_calls.json.gz`` was recorded on this project's CPU machine with::

    model = torch.compile(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)))
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            model(torch.randn(32, 64)).sum().backward()
    prof.export_chrome_trace(path)
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from test_misreadings import H100, kernel, write_trace, x

from fixtures import DATA, TRACES
from perfhooks.offline.analyze import analyze_paths


def raw_events(path: Path) -> list[dict[str, Any]]:
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document["traceEvents"] if isinstance(document, dict) else document
    return [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]


def union_us(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def test_a_cold_legacy_a4000_window_is_start_up_not_a_critical_idle_gpu() -> None:
    path = TRACES / "more2" / "willding_a4000_legacy_kernelcat.json.gz"
    events = raw_events(path)
    window = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    runtime = [e for e in events if e["cat"] == "cuda_runtime"]
    launches = [e for e in runtime if e["name"] == "cudaLaunchKernel"]
    median = statistics.median(e["dur"] for e in launches)
    loads = [e for e in launches if e["dur"] > max(1000.0, 50 * median)]
    setup = [e for e in runtime if e["name"] in ("cudaFree", "cudaStreamCreateWithFlags") and e["dur"] > 1000.0]
    startup = union_us([(e["ts"], e["ts"] + e["dur"]) for e in loads + setup])
    kernels = sum(e["dur"] for e in events if e["cat"] == "Kernel")
    assert len(loads) == 8 and startup / window > 0.80  # by hand: 10.1 of 12.0 s (8 loads, 2 cudaFree, 1 stream)
    assert kernels / (window - startup) < 0.01  # what is left is still idle: the old critical verdict's premise

    report = analyze_paths([path])
    ids = [d["id"] for d in report["diagnoses"]]
    assert ids == ["startup_in_window", "window_not_steady"]
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "window_not_steady"]
    assert verdict["severity"] == "info" and verdict["estimated_gain"] == 0
    assert verdict["measured"]["excluded_share"] > 0.80
    assert report["metrics"]["steady"]["gpu_utilization"] is None


def test_a_window_that_is_mostly_compilation_is_said_to_be_and_not_judged() -> None:
    path = DATA / "recorded" / "cpu_compile_first_calls.json.gz"
    events = raw_events(path)
    window = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    compiling = [e for e in events if e["name"] in ("dynamo", "backend_compile", "inductor_compile")
                 or "(dynamo_timed)" in e["name"]]
    assert union_us([(e["ts"], e["ts"] + e["dur"]) for e in compiling]) / window > 0.75

    report = analyze_paths([path])
    ids = sorted(d["id"] for d in report["diagnoses"])
    assert ids == ["compile_warmup", "window_not_steady"]
    steady = report["metrics"]["steady"]
    assert steady["compile_us"] / (report["metrics"]["step_us"] * report["metrics"]["steps"]) > 0.75
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "window_not_steady"]
    assert "compilation" in verdict["evidence"]


def first_call_trace(tmp_path: Path, queries: int) -> Path:
    """No step markers, 100 ms: a first convolution whose algorithm search makes ``queries`` cudaFuncGetAttributes
    calls over 60 ms, then 40 convolutions of 1 ms, each launching a 0.5 ms kernel 5 µs after its launch."""
    events = [x("cpu_op", "aten::cudnn_convolution", 0.0, 60_000.0)]
    for index in range(queries):
        events.append(x("cuda_runtime", "cudaFuncGetAttributes", 10.0 + index * (59_000.0 / queries), 2.0))
    for index in range(40):
        start = 60_000.0 + index * 1_000.0
        correlation = index + 1
        events.append(x("cpu_op", "aten::cudnn_convolution", start, 1_000.0))
        events.append(x("cuda_runtime", "cudaLaunchKernel", start + 10.0, 5.0, correlation=correlation))
        events.append(kernel("sm80_xmma_fprop_implicit_gemm", start + 20.0, 500.0, correlation))
    return write_trace(tmp_path, events, devices=H100)


def test_a_first_call_algorithm_search_is_start_up_and_the_rest_is_judged(tmp_path: Path) -> None:
    # 60 of 100 ms is the search: excluded, under the 75% bound, so the 40 ms left (50% busy) is judged
    report = analyze_paths([first_call_trace(tmp_path, queries=300)])
    steady = report["metrics"]["steady"]
    assert steady["first_call_us"] == 60_000.0 and not steady["mostly_not_steady"]
    assert steady["gpu_utilization"] == 20_000.0 / 40_000.0
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "low_gpu_utilization"]
    assert verdict["severity"] == "warning"  # before: critical, at 20 ms of kernels in 100 ms

    # a handful of queries is an ordinary launch, not a search: nothing is excluded
    plain = analyze_paths([first_call_trace(tmp_path, queries=10)])
    assert not plain["metrics"]["steady"]


def test_a_lazy_first_launch_is_start_up(tmp_path: Path) -> None:
    """Each of 3 kernels' first launch takes 400 µs (module loaded lazily), later launches 5 µs."""
    events = []
    for index in range(60):
        correlation = index + 1
        name = f"kernel_{index % 3}"
        first = index < 3
        start = index * 1_000.0
        events.append(x("cuda_runtime", "cudaLaunchKernel", start, 400.0 if first else 5.0, correlation=correlation))
        events.append(kernel(name, start + 450.0, 400.0, correlation))
    report = analyze_paths([write_trace(tmp_path, events, devices=H100)])
    assert report["metrics"]["steady"]["first_call_us"] == 3 * 400.0


def test_the_profilers_own_stop_does_not_stretch_the_window(tmp_path: Path) -> None:
    """Issue 40, class 4: recorded with stacks, the profiler's stop (``torch/profiler/profiler.py: stop_trace``
    and the frames inside it) can end most of a second after the last kernel. The real H100 trace, without its
    ProfilerStep (so that the window is the host's events, as in the MI300X trace of the issue), and a copy whose
    stop frames end 657 ms after its last kernel: the window, and so the utilization, must be the same."""
    source = TRACES / "more" / "tl_h100_qwen05b.json.gz"
    document = json.loads(gzip.decompress(source.read_bytes()))
    document["traceEvents"] = [e for e in document["traceEvents"] if not str(e.get("name")).startswith("ProfilerStep")]
    unstretched = tmp_path / "no_step.json"
    unstretched.write_text(json.dumps(document))
    events = document["traceEvents"]
    last_kernel = max(e["ts"] + e["dur"] for e in events if e.get("cat") == "kernel")
    [stop] = [e for e in events if e.get("ph") == "X" and e["name"].startswith("torch/profiler/profiler.py(")
              and e["name"].endswith("): stop_trace")]
    inside = [e for e in events if e.get("ph") == "X" and e.get("cat") == "python_function" and e is not stop
              and stop["ts"] <= e["ts"] and e["ts"] + e["dur"] <= stop["ts"] + stop["dur"]]
    assert inside  # the autograd profiler's __exit__ and a synchronize run inside the stop
    stretch = last_kernel + 657_000.0 - (stop["ts"] + stop["dur"])
    for event in [stop, *inside]:
        if event["ts"] + event["dur"] == stop["ts"] + stop["dur"]:
            event["dur"] += stretch
    stop["dur"] += 0 if stop["ts"] + stop["dur"] >= last_kernel + 657_000.0 else stretch
    path = tmp_path / "stretched.json"
    path.write_text(json.dumps(document))

    original, stretched = analyze_paths([unstretched]), analyze_paths([path])
    assert original["metrics"]["step_rule"] == "host_window"
    assert stretched["metrics"]["step_us"] == original["metrics"]["step_us"]
    assert stretched["metrics"]["gpu_utilization"] == original["metrics"]["gpu_utilization"] > 0.5
