import json
import warnings
from pathlib import Path

import pytest

from helpers import ManualClock
from perfhooks import Engine, PerfConfig, PerfhooksWarning
from perfhooks.report.schema import validate_report


def make_engine(tmp_path: Path, **settings) -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    settings.setdefault("schedule", None)
    settings.setdefault("console", False)
    return Engine(PerfConfig(**settings), tmp_path, "test", clock=clock), clock


def run_step(engine: Engine, clock: ManualClock, wait: float, forward: float, backward: float, optimizer: float,
             other: float = 0.0) -> None:
    engine.phase_start("data_wait")
    clock.advance(wait)
    engine.phase_start("forward")
    clock.advance(forward)
    engine.phase_start("backward")
    clock.advance(backward)
    engine.phase_end("backward")
    clock.advance(other)
    engine.phase_start("optimizer")
    clock.advance(optimizer)
    engine.phase_end("optimizer")
    engine.step_end()


def test_exact_phase_times_shares_and_coverage(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    for _ in range(4):
        run_step(engine, clock, wait=2, forward=3, backward=4, optimizer=1, other=0.5)
    report = engine.close()
    assert report is not None
    assert report["steps"] == 4
    assert report["step_ms"]["mean"] == pytest.approx(10.5)
    phases = report["phases"]
    assert phases["data_wait"]["mean_ms"] == pytest.approx(2)
    assert phases["forward"]["p50_ms"] == pytest.approx(3, rel=0.01)
    assert phases["backward"]["max_ms"] == pytest.approx(4)
    assert phases["other"]["mean_ms"] == pytest.approx(0.5)
    assert phases["optimizer"]["share"] == pytest.approx(1 / 10.5, rel=1e-4)
    assert report["coverage"] == pytest.approx(10 / 10.5, rel=1e-4)
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0, abs=1e-5)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written == report
    assert validate_report(written) == []
    assert written["status"] == "completed"


def test_idle_discards_a_wait_that_was_not_for_a_training_batch(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    run_step(engine, clock, 1, 1, 1, 1)
    engine.phase_start("data_wait")
    clock.advance(500)  # validation runs here
    engine.idle()
    clock.advance(100)
    run_step(engine, clock, 1, 1, 1, 1)
    report = engine.close()
    assert report["steps"] == 2
    assert report["step_ms"]["max"] == pytest.approx(4)


def test_phases_are_exclusive_and_unmatched_ends_are_ignored(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    engine.phase_start("forward")
    clock.advance(2)
    engine.phase_start("backward")  # closes forward
    clock.advance(3)
    engine.phase_end("forward")  # not open: ignored
    clock.advance(1)
    engine.step_end()  # closes backward
    report = engine.close()
    assert report["phases"]["forward"]["mean_ms"] == pytest.approx(2)
    assert report["phases"]["backward"]["mean_ms"] == pytest.approx(4)
    assert report["micro_batches"] == 1


def test_a_fault_inside_perfhooks_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    with pytest.warns(PerfhooksWarning, match="phase_start failed") as caught:
        for _ in range(5):
            engine.phase_start("not_a_phase")
            run_step(engine, clock, 1, 1, 1, 1)
    assert len([w for w in caught if "phase_start" in str(w.message)]) == 1
    report = engine.close()
    assert report["steps"] == 5
    assert report["faults"] == [{"kind": "phase_start", "count": 5,
                                 "message": "ValueError: unknown phase 'not_a_phase'; phases are "
                                            "data_wait, forward, backward, optimizer"}]


def test_exception_marks_the_report_and_close_is_idempotent(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    run_step(engine, clock, 1, 1, 1, 1)
    engine.phase_start("forward")
    engine.exception(RuntimeError("boom"))
    assert engine.close() is None
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "failed"
    assert report["error"] == {"type": "RuntimeError", "message": "boom", "step": 1, "phase": "forward"}
    assert report["steps"] == 1
    engine.phase_start("forward")  # events after close are ignored, not errors
    engine.step_end()


def test_unwritable_output_dir_warns_and_does_not_raise(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    engine, clock = make_engine(blocker / "out")
    with pytest.warns(PerfhooksWarning) as caught:
        run_step(engine, clock, 1, 1, 1, 1)
        report = engine.close()
    assert [str(w.message).split(" failed")[0] for w in caught] == ["perfhooks: report_write"]
    assert report["steps"] == 1
    assert [f["kind"] for f in engine.faults.as_list()] == ["report_write"]
    assert list(tmp_path.iterdir()) == [blocker]


def test_state_dict_round_trip_keeps_the_step(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    for _ in range(3):
        run_step(engine, clock, 1, 1, 1, 1)
    resumed, _ = make_engine(tmp_path)
    resumed.load_state_dict(engine.state_dict())
    assert resumed.step == 3


def test_no_warning_on_a_clean_run(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_step(engine, clock, 1, 1, 1, 1)
        engine.close()
