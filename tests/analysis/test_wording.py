"""Issue 40, class 7 and "likely gain": the headline says which utilization is which, a trace without device
activity says so instead of calling the machine a CPU, and a gain is worded as the ceiling it is."""

from __future__ import annotations

from pathlib import Path

from test_misreadings import write_trace, x

from fixtures import TRACES
from perfhooks.offline.analyze import analyze_paths
from perfhooks.rules.verdicts import gain_phrase
from perfhooks.sinks.text import format_analysis


def test_the_headline_says_whole_window_and_steady_state() -> None:
    report = analyze_paths([TRACES / "more2" / "tugot17_rtx4090x2_tp_llama4l_rank0.json.gz"])
    steady = report["metrics"]["steady"]["gpu_utilization"]
    whole = report["metrics"]["gpu_utilization"]
    assert steady > whole  # start-up is 65% of the window: the two differ, and the verdicts use the steady one
    text = format_analysis(report)
    assert (f"GPU utilization {whole:.1%} over the whole window; steady state (less start-up, capture and "
            f"compilation) {steady:.1%}") in text
    cold = format_analysis(analyze_paths([TRACES / "more2" / "willding_a4000_legacy_kernelcat.json.gz"]))
    assert "compilation) not judged" in cold


def test_a_trace_without_device_activity_on_a_gpu_machine_is_not_called_cpu(tmp_path: Path) -> None:
    events = [x("user_annotation", "ProfilerStep#1", 0.0, 10_000.0), x("cpu_op", "aten::mm", 100.0, 9_000.0)]
    gpu = [{"id": 0, "name": "NVIDIA GeForce RTX 4080 SUPER", "computeMajor": 8, "computeMinor": 9}]
    report = analyze_paths([write_trace(tmp_path, events, devices=gpu)])
    assert report["device"]["type"] == "not_recorded"
    assert report["device"]["name"] == "NVIDIA GeForce RTX 4080 SUPER (listed; its activity was not recorded)"
    assert any("ProfilerActivity.CUDA was off" in warning for warning in report["warnings"])
    assert not [d for d in report["diagnoses"] if d["id"] == "low_gpu_utilization"]
    # the same events with no deviceProperties: a CPU trace
    plain = analyze_paths([write_trace(tmp_path, events, name="cpu.json")])
    assert plain["device"]["type"] == "cpu" and not plain["warnings"]


def test_a_gain_is_worded_as_a_ceiling_of_its_own_basis() -> None:
    assert gain_phrase({"estimated_gain": 0.31}) == "saves at most 31% of the step"
    assert gain_phrase({"estimated_gain": 0.004}) == "saves under 1% of the step"
    assert gain_phrase({"estimated_gain": 0.25, "gain_basis": "run"}) == "saves at most 25% of the run's wall time"
    assert gain_phrase({"estimated_gain": 0.0}) == ""  # before: "up to 0% of step time" on every info verdict
    report = analyze_paths([TRACES / "more2" / "willding_a4000_legacy_kernelcat.json.gz"])
    text = format_analysis(report)
    assert "up to 0%" not in text and "window_not_steady: Most of the window" in text
