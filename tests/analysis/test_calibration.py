"""The calibration table (tests/data/calibration.json): on every shared trace, exactly the verdicts whose
evidence is in the events fire, the step rule and step count are right, and the JSON is strict JSON."""

from __future__ import annotations

import json

import pytest

from fixtures import DATA, TRACES

CALIBRATION = json.loads((DATA / "calibration.json").read_text())["traces"]


@pytest.fixture(scope="module")
def reports():
    from perfhooks.offline.analyze import analyze_paths

    return {name: analyze_paths([TRACES / name]) for name in CALIBRATION}


def test_the_table_covers_every_trace_in_tests_data():
    on_disk = {str(p.relative_to(TRACES)) for p in TRACES.rglob("*.json.gz")}
    assert on_disk == set(CALIBRATION)


@pytest.mark.parametrize("name", sorted(CALIBRATION))
def test_verdicts_match_the_evidence(name, reports):
    expected = CALIBRATION[name]
    report = reports[name]
    fired = {d["id"] for d in report["diagnoses"]}
    assert fired == set(expected["fire"]), f"{name}: fired {sorted(fired)}"
    assert not fired & set(expected["silent"])
    metrics = report["metrics"]
    assert metrics["step_rule"] == expected["step_rule"]
    assert metrics["steps"] == expected["steps"]
    bounds = expected["gpu_utilization"]
    if bounds is None:
        assert metrics["gpu_utilization"] is None
    else:
        assert bounds[0] <= metrics["gpu_utilization"] <= bounds[1]
    for fragment in expected.get("warnings", []):
        assert any(fragment in warning for warning in report["warnings"]), report["warnings"]
    if not expected.get("warnings"):
        assert report["warnings"] == []  # no skipped events, no missing data on a good trace
    json.dumps(report, allow_nan=False)  # strict JSON: no NaN or Infinity
