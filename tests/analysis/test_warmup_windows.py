"""Issue 53, item 1: a serving engine's warm-up window on ROCm, from raw events. 25 piecewise graph captures
(``hipStreamBeginCapture`` ... ``hipStreamEndCapture``, 45 ms) and, around them, graph instantiation and upload and
modules loaded at first launch (121 ms of runtime calls), with 0.84 ms of kernels in a 174 ms window. Everything in
it is warm-up: it reads ``window_not_steady``, not a critical idle GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_misreadings import kernel, write_trace, x

from perfhooks.offline.analyze import analyze_paths

MI300X = [{"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4, "numSms": 304}]


def warmup_trace(tmp_path: Path) -> tuple[Path, dict[str, float]]:
    """The window, and its parts by what they are (µs)."""
    events: list[dict[str, Any]] = []
    t, correlation = 0.0, 0
    parts = {"capture": 0.0, "instantiate": 0.0, "upload": 0.0, "module": 0.0, "kernel": 0.0}
    for graph in range(25):
        # a module loaded at the first launch of the graph's kernels (lazy loading), before its capture
        events.append(x("cuda_runtime", "hipModuleLoadData", t, 1_200.0))
        parts["module"] += 1_200.0
        t += 1_250.0
        events.append(x("cuda_runtime", "hipStreamBeginCapture", t, 20.0))
        for _ in range(10):  # launches recorded into the graph: they run nothing
            correlation += 1
            events.append(x("cuda_runtime", "hipLaunchKernel", t + 40.0, 5.0, correlation=correlation))
            t += 170.0
        events.append(x("cuda_runtime", "hipStreamEndCapture", t + 40.0, 60.0))
        parts["capture"] += t + 100.0 - (t - 1_700.0)
        t += 150.0
        events.append(x("cuda_runtime", "hipGraphInstantiate", t, 2_200.0))
        parts["instantiate"] += 2_200.0
        t += 2_250.0
        events.append(x("cuda_runtime", "hipGraphUpload", t, 1_300.0))
        parts["upload"] += 1_300.0
        t += 1_350.0
        correlation += 1  # one warm-up replay's kernel
        events.append(x("cuda_runtime", "hipGraphLaunch", t, 8.0, correlation=correlation))
        events.append(kernel("rocm_warmup_kernel", t + 20.0, 33.6, correlation))
        parts["kernel"] += 33.6
        t += 100.0
    return write_trace(tmp_path, events, devices=MI300X), {**parts, "window": t}


def test_a_rocm_warmup_window_of_captures_instantiation_and_module_loads_is_not_judged(tmp_path: Path) -> None:
    path, parts = warmup_trace(tmp_path)
    one_time = parts["capture"] + parts["instantiate"] + parts["upload"] + parts["module"]
    assert one_time / parts["window"] > 0.9 and parts["kernel"] / parts["window"] < 0.01  # the premise
    report = analyze_paths([path])
    verdicts = {d["id"]: d for d in report["diagnoses"]}
    assert "window_not_steady" in verdicts, [(d["id"], d["severity"]) for d in report["diagnoses"]]
    assert not [d for d in report["diagnoses"] if d["severity"] == "critical"]
    assert "low_gpu_utilization" not in verdicts
