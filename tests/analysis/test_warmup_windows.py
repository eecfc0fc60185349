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
    for _ in range(25):
        # a module loaded at the first launch of the graph's kernels (lazy loading), before its capture
        events.append(x("cuda_runtime", "hipModuleLoadData", t, 1_200.0))
        parts["module"] += 1_200.0
        t += 1_250.0
        began = t
        events.append(x("cuda_runtime", "hipStreamBeginCapture", t, 20.0))
        for _ in range(10):  # launches recorded into the graph: they run nothing
            correlation += 1
            events.append(x("cuda_runtime", "hipLaunchKernel", t + 40.0, 5.0, correlation=correlation))
            t += 170.0
        events.append(x("cuda_runtime", "hipStreamEndCapture", t + 40.0, 60.0))
        parts["capture"] += t + 100.0 - began
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


def test_a_step_less_window_stretched_by_a_synchronize_and_the_profilers_exit_keeps_its_utilization(
        tmp_path: Path) -> None:
    """Issue 53, item 2: the real SGLang window (with_stack), stretched as the MI300X one was. After its last kernel
    the script calls ``torch.cuda.synchronize()`` on an idle device for 650 ms, then the profiler's ``__exit__``
    runs, and an enclosing frame of the script's spans all of it. That tail is teardown: the window's utilization
    stays within 2 points of the unstretched window's."""
    import gzip
    import json

    from fixtures import TRACES

    source = TRACES / "more" / "tl_sglang_qwen3_prefilldecode.json.gz"
    with gzip.open(source) as raw:
        document = json.loads(raw.read())
    events = document["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X" and "ts" in e]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + e.get("dur", 0) for e in timed)
    host = next(e for e in timed if e.get("cat") == "python_function")
    pid, tid = host["pid"], host["tid"]

    def frame(name: str, ts: float, dur: float, cat: str = "python_function") -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}

    stretched = [*events,
                 frame("serve.py(88): <module>", start, end - start + 660_000.0),
                 frame("torch/cuda/__init__.py(1072): synchronize", end + 20.0, 650_000.0),
                 frame("cudaDeviceSynchronize", end + 30.0, 649_980.0, cat="cuda_runtime"),
                 frame("torch/profiler/profiler.py(810): __exit__", end + 650_100.0, 7_000.0)]
    before = analyze_paths([source])["metrics"]["gpu_utilization"]
    path = tmp_path / "stretched.json"
    path.write_text(json.dumps({**document, "traceEvents": stretched}))
    after = analyze_paths([path])["metrics"]["gpu_utilization"]
    assert abs(after - before) <= 0.02, (before, after)
