"""``host_bound``: the GPU waits on the host, and its kernels are not tiny. Checked on the real H100 trace of a
135M GPT in Lightning (bf16, 717 kernels a step, 32% under 10 µs), against its raw figures; and the window's own
cost (62-65 ms steps against a 39 ms steady step) taken out in the run's report."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfhooks.capture.window_job import analyze_window
from perfhooks.rules.pipeline import merge_verdicts
from perfhooks.rules.thresholds import Thresholds

H100_LIGHTNING = (Path(__file__).parents[1] / "data" / "traces" / "h100"
                  / "lightning_gpt135m_bf16_window.pt.trace.json.gz")
#: The fit's steady step outside the window, by its own clock (PROVENANCE.md).
STEADY_MS = 39.0


@pytest.fixture(scope="module")
def window() -> tuple[dict, list]:
    return analyze_window(H100_LIGHTNING, Thresholds(), 10)


def test_the_h100_lightning_gpt_window_is_host_bound_not_launch_bound(window: tuple[dict, list]) -> None:
    _, diagnoses = window
    verdicts = {d["id"]: d for d in diagnoses}
    assert "launch_bound" not in verdicts, "its kernels are not tiny: 32% under 10 µs"
    host = verdicts["host_bound"]
    measured = host["measured"]
    assert measured["kernels_per_step"] == 717
    assert measured["kernel_ms_per_step"] == pytest.approx(24.0, abs=0.1)  # the breakdown's kernel time a step
    assert measured["host_ms_per_step"] > measured["kernel_ms_per_step"]
    assert 0.55 < host["estimated_gain"] < 0.62  # 62% idle, 98% of it waiting on the host
    assert "torch.compile" in host["recommendation"] and "reduce-overhead" in host["recommendation"]


def test_against_the_steady_step_the_utilization_verdict_goes_and_host_bound_shrinks(window: tuple[dict, list]
                                                                                       ) -> None:
    """The steady step's own figures (24 ms of kernels in 39 ms) give about 62% utilization: above the 60%
    threshold, so no low_gpu_utilization; the GPU still waits on the host about 37% of the steady step."""
    _, diagnoses = window
    merged = {d["id"]: d for d in merge_verdicts(trace=diagnoses, steady_step_ms=STEADY_MS)}
    assert "low_gpu_utilization" not in merged
    host = merged["host_bound"]
    assert host["measured"]["gpu_utilization_steady"] == pytest.approx(24.08 / STEADY_MS, abs=0.01)
    assert 0.33 < host["estimated_gain"] < 0.40
    assert "1.6x the run's steady step" in host["evidence"]
