"""The run account and the step boundaries around it, on a clock the test moves by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import ManualClock, framework_step
from perfhooks import Engine, PerfConfig
from perfhooks.report.schema import validate_report
from perfhooks.runtime.step.run_account import RunAccount


def make_engine(tmp_path: Path) -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    return Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "test", clock=clock), clock


def test_time_after_the_optimizer_is_the_steps_other_until_the_next_fetch(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    for step in range(3):
        framework_step(engine, clock, global_step=10 + step, callbacks_ms=5)
    report = engine.close()
    assert report["steps"] == 3 and report["global_step"] == 12
    assert report["series"]["global_step"] == [10, 11, 12]
    assert report["step_ms"]["mean"] == pytest.approx(13.5)
    assert report["phases"]["data_wait"]["max_ms"] == pytest.approx(0.5)
    assert report["phases"]["other"]["mean_ms"] == pytest.approx(5)
    assert validate_report(report) == []


def test_a_checkpoint_inside_a_step_is_checkpointing_not_step_time(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    for step in range(12):
        framework_step(engine, clock, global_step=step + 1, callbacks_ms=1, checkpoint_ms=300 if step == 4 else 0)
    engine.idle()  # the epoch ends
    clock.advance(7)  # the end of fit, after the last step
    report = engine.close()
    assert report["step_ms"]["max"] == pytest.approx(9.5)
    assert report["phases"]["data_wait"]["max_ms"] == pytest.approx(0.5)
    run = report["run"]
    assert run["checkpoints"] == 1 and run["checkpointing_s"] == pytest.approx(0.3)
    assert run["training_s"] == pytest.approx(12 * 0.0095)
    assert run["wall_s"] == pytest.approx(12 * 0.0095 + 0.3 + 0.007)
    assert run["other_s"] == pytest.approx(0.007)
    ids = {d["id"]: d for d in report["diagnoses"]}
    assert "checkpoint_heavy" in ids and "dataloader_bound" not in ids
    assert ids["checkpoint_heavy"]["measured"]["checkpointing_share"] == pytest.approx(0.3 / run["wall_s"])


def test_evaluation_between_steps_and_a_checkpoint_inside_it(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    for step in range(10):
        framework_step(engine, clock, global_step=step + 1)
        if step == 4:
            engine.aside_start("evaluation")
            clock.advance(30)
            with engine.aside("checkpoint"):  # ModelCheckpoint at the end of validation
                clock.advance(50)
            clock.advance(20)
            engine.aside_end("evaluation")
    report = engine.close()
    run = report["run"]
    assert run["evaluation_s"] == pytest.approx(0.05) and run["checkpointing_s"] == pytest.approx(0.05)
    assert report["step_ms"]["max"] == pytest.approx(8.5)
    assert run["training_s"] + run["evaluation_s"] + run["checkpointing_s"] + run["other_s"] == pytest.approx(
        run["wall_s"], rel=0.01)
    found = {d["id"]: d for d in report["diagnoses"]}
    assert found["evaluation_heavy"]["measured"]["evaluation_share"] == pytest.approx(0.05 / run["wall_s"])
    assert found["checkpoint_heavy"]["measured"]["checkpointing_share"] == pytest.approx(0.05 / run["wall_s"])


def test_a_wait_then_an_epoch_end_is_no_step(tmp_path: Path) -> None:
    engine, clock = make_engine(tmp_path)
    framework_step(engine, clock, global_step=1)
    engine.idle()  # the epoch ends: the stepped step ends here
    engine.fetch()
    clock.advance(40)  # the loader runs out
    engine.idle()
    report = engine.close()
    assert report["steps"] == 1 and report["step_ms"]["max"] == pytest.approx(8.5)


def test_unknown_asides_and_unmatched_ends() -> None:
    account = RunAccount(clock=iter(range(0, 10**9, 10**6)).__next__)
    with pytest.raises(ValueError, match="unknown aside 'lunch'; asides are checkpoint, compiling, evaluation"):
        account.begin("lunch")
    assert account.end("evaluation") is False
    assert account.section(0.0) is None  # no step yet


def test_an_evaluation_before_the_first_step_is_inside_the_wall_clock() -> None:
    """Issue 41, item 1: HF ``eval_on_start`` and nanoGPT's iteration-0 evaluation ran before the first step,
    and the wall clock started at that step: training 78.3% + evaluation 27.2% + checkpointing 1.7%."""
    ticks = iter([0, 3_000_000_000, 3_000_000_000, 10_000_000_000])  # ns: eval 0-3 s, steps 3-10 s
    account = RunAccount(clock=ticks.__next__)
    account.begin("evaluation")
    account.end("evaluation")
    account.started()
    account.close()
    run = account.section(training_ms=7_000.0)
    assert run is not None
    assert (run["wall_s"], run["evaluation_s"], run["training_s"]) == (10.0, 3.0, 7.0)
    assert sum(run["shares"].values()) == pytest.approx(1.0)
    assert run["shares"]["evaluation"] == 0.3
