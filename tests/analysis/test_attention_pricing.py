"""Issue 40, class 5: attention is priced by what it costs where it runs. On a GPU trace, by the device time of
everything launched inside the attention op, not its host time; on a CPU trace, by host time with
``aten::softmax`` and the ``aten::_softmax`` inside it counted once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_misreadings import H100, kernel, write_trace, x

from perfhooks.offline.analyze import analyze_paths


def test_attention_on_a_gpu_is_priced_by_its_kernels_not_its_host_time(tmp_path: Path) -> None:
    """One 10 ms step: ``aten::_native_multi_head_attention`` holds the host for 3.67 ms and launches a bmm
    (0.10 ms), a softmax (0.04 ms) and a bmm (0.05 ms) on the device, through its child ops; a 7 ms GEMM fills
    the rest of the step."""
    events = [x("user_annotation", "ProfilerStep#1", 0.0, 10_000.0),
              x("cpu_op", "aten::_native_multi_head_attention", 100.0, 3_670.0, **{"External id": 1})]
    launches = [("aten::bmm", 2, "ampere_sgemm_64x64_nn", 100.0), ("aten::_softmax", 3, "softmax_warp_forward", 40.0),
                ("aten::bmm", 4, "ampere_sgemm_64x64_nn", 50.0)]
    t = 200.0
    for op, ext, name, dur in launches:
        events.append(x("cpu_op", op, t, 300.0, **{"External id": ext}))
        events.append(x("cuda_runtime", "cudaLaunchKernel", t + 10.0, 5.0, correlation=ext, **{"External id": ext}))
        events.append(kernel(name, t + 20.0, dur, ext, ext))
        t += 1_000.0
    events.append(x("cpu_op", "aten::mm", 4_000.0, 100.0, **{"External id": 9}))
    events.append(x("cuda_runtime", "cudaLaunchKernel", 4_010.0, 5.0, correlation=9, **{"External id": 9}))
    events.append(kernel("ampere_bf16_s16816gemm", 4_020.0, 5_900.0, 9, 9))
    path = write_trace(tmp_path, events, devices=H100)
    raw = json.loads(path.read_text())["traceEvents"]
    attention = next(e for e in raw if e["name"] == "aten::_native_multi_head_attention")
    launched = {e["args"]["correlation"] for e in raw if e["name"] == "cudaLaunchKernel"
                and attention["ts"] <= e["ts"] < attention["ts"] + attention["dur"]}
    device_us = sum(e["dur"] for e in raw if e.get("cat") == "kernel" and e["args"]["correlation"] in launched)
    assert device_us == 190.0 and attention["dur"] == 3_670.0  # by hand: 1.9% against 36.7% of the step

    report = analyze_paths([path])
    assert report["metrics"]["attention"]["unfused"] == device_us
    assert "unfused_attention" not in [d["id"] for d in report["diagnoses"]]  # 1.9% is under the 3% threshold


@pytest.fixture(scope="module")
def cpu_attention_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real CPU trace: attention written out by hand (q @ k^T, softmax, @ v), five calls."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 8, 128, 64) for _ in range(3))
    path = tmp_path_factory.mktemp("cpu_attention") / "trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(5):
            torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1) @ v
    prof.export_chrome_trace(str(path))
    return path


def test_softmax_and_the_softmax_inside_it_are_counted_once_on_cpu(cpu_attention_trace: Path) -> None:
    raw = [e for e in json.loads(cpu_attention_trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    outer = [e for e in raw if e["name"] == "aten::softmax"]
    inner = [e for e in raw if e["name"] == "aten::_softmax"]
    assert len(outer) == len(inner) == 5
    assert all(any(o["ts"] <= i["ts"] and i["ts"] + i["dur"] <= o["ts"] + o["dur"] for o in outer) for i in inner)
    bmm = sorted((e for e in raw if e["name"] == "aten::bmm"), key=lambda e: e["ts"])
    # the core of each call, which SDPA replaces: from the scores' bmm to the one that applies them (the division
    # by sqrt(d) and the softmax between them), each counted once (issue 67: the bmms and softmaxes alone, and
    # before that the inner softmax twice, priced less than SDPA then saved)
    expected = 0.0
    for softmax in outer:
        scores = max((e for e in bmm if e["ts"] + e["dur"] <= softmax["ts"]), key=lambda e: e["ts"])
        applied = min((e for e in bmm if e["ts"] >= softmax["ts"] + softmax["dur"]), key=lambda e: e["ts"])
        expected += applied["ts"] + applied["dur"] - scores["ts"]
    assert expected > sum(e["dur"] for e in outer) + sum(e["dur"] for e in bmm)

    report = analyze_paths([cpu_attention_trace])
    assert report["metrics"]["attention"]["unfused"] == pytest.approx(expected, abs=0.01)
