"""A capture window's steps run slower than the run's (the profiler slows the host, not the kernels): its
utilization verdict is judged against the run's steady step, on real traces with steady figures beside them."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfhooks.capture.window_job import analyze_window
from perfhooks.rules.pipeline import merge_verdicts
from perfhooks.rules.thresholds import Thresholds

TRACES = Path(__file__).parents[1] / "data" / "traces"


def _utilization(name: str) -> tuple[dict, list]:
    _, diagnoses = analyze_window(TRACES / name, Thresholds(), 0)
    verdict = next(d for d in diagnoses if d["id"] == "low_gpu_utilization")
    return verdict, diagnoses


@pytest.mark.parametrize("name", ["tb_plugin/resnet50_num_workers_0.worker0.1623143089861.pt.trace.json.gz",
                                  "hta/v100_rank1_of2_annotations.json.gz"])
def test_a_window_1_6x_the_steady_step_gets_no_verdict_the_steady_figures_do_not_support(name: str) -> None:
    verdict, diagnoses = _utilization(name)
    steady_ms = verdict["measured"]["step_ms"] / 1.6
    assert verdict["measured"]["gpu_utilization"] * 1.6 >= Thresholds().gpu_utilization  # the premise
    merged = merge_verdicts(trace=diagnoses, steady_step_ms=steady_ms)
    assert "low_gpu_utilization" not in [d["id"] for d in merged]
    unchanged = merge_verdicts(trace=diagnoses, steady_step_ms=verdict["measured"]["step_ms"])
    assert "low_gpu_utilization" in [d["id"] for d in unchanged], "a window as fast as the run is judged as is"


def test_a_critical_window_verdict_is_restated_against_the_steady_step() -> None:
    verdict, diagnoses = _utilization("hta/a100_nccl_rank0_of2.json.gz")
    assert verdict["severity"] == "critical"
    window_ms, utilization = verdict["measured"]["step_ms"], verdict["measured"]["gpu_utilization"]
    merged = merge_verdicts(trace=diagnoses, steady_step_ms=window_ms / 1.6)
    restated = next(d for d in merged if d["id"] == "low_gpu_utilization")
    steady = utilization * 1.6
    assert restated["severity"] == "warning", "no critical verdict the steady run does not have"
    assert restated["measured"]["gpu_utilization_steady"] == pytest.approx(steady, abs=1e-4)
    assert restated["estimated_gain"] == pytest.approx(1 - steady, abs=1e-4)
    assert "1.6x the run's steady step" in restated["evidence"]
