"""Dark steps (issue 75): counted and nothing else, timed in blocks, so the step count, the run account and
throughput stay exact; and the wall-clock prices of light and detailed steps, paired in the run, on a clock the
test moves by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import ManualClock, framework_step
from perfhooks import Engine, PerfConfig
from perfhooks.report.schema import validate_report

STEPS = 6000


def run(tmp_path: Path, dark: bool, light_ms: float = 0.0, detailed_ms: float = 0.0, steps: int = STEPS,
        every_epoch: int = 0, live: list[float] | None = None) -> dict[str, Any]:
    """A framework's loop on a manual clock, one step in a hundred detailed; ``light_ms``/``detailed_ms``: what a light
    step and a detailed one add to the user's time (the clock moves that much more in such a step's fetch).
    ``every_epoch``: an epoch's end (the loader runs out) and a checkpoint every that many steps. ``live`` gets
    what ``perfhooks top`` would show at the end (the published share)."""
    clock = ManualClock()
    config = PerfConfig(schedule=None, console=False, on_demand=False, memory=False, overhead_budget=0.01)
    engine = Engine(config, tmp_path, "test", clock=clock)
    sampler = engine.tracker.sampler
    sampler.hold(0.01)
    if not dark:
        sampler.dark_share = 0.0
    tracker = engine.tracker
    for step in range(steps):
        if tracker.light and not tracker._dark_left:
            clock.advance(light_ms)
        elif not tracker.light and tracker.record is not None:
            clock.advance(light_ms + detailed_ms)
        framework_step(engine, clock, callbacks_ms=0.5, checkpoint_ms=2.0 if every_epoch and step % every_epoch == 7
                       else 0.0)
        if every_epoch and step % every_epoch == every_epoch - 1:
            engine.idle()
            clock.advance(5.0)
    if live is not None:
        live.append(engine.publish().own_share)
    report = engine.close()
    assert report is not None and validate_report(report) == []
    return report


@pytest.mark.parametrize("every_epoch", [0, 997])
def test_dark_steps_keep_the_step_count_the_run_account_and_throughput_exact(tmp_path: Path,
                                                                             every_epoch: int) -> None:
    with_dark = run(tmp_path / "dark", dark=True, every_epoch=every_epoch)
    without = run(tmp_path / "light", dark=False, every_epoch=every_epoch)
    assert with_dark["overhead"]["dark_steps"] > 0.15 * STEPS
    assert without["overhead"]["dark_steps"] == 0
    for key in ("steps", "micro_batches", "phase_steps", "global_step"):
        assert with_dark[key] == without[key], key
    assert with_dark["steps"] == STEPS
    assert with_dark["step_ms"]["mean"] == pytest.approx(without["step_ms"]["mean"], rel=1e-9)
    assert with_dark["step_ms"]["mean"] == pytest.approx(0.5 + 3 + 4 + 1 + 0.5)  # fetch, phases, callbacks
    assert with_dark["data_fetch_ms"]["mean"] == pytest.approx(0.5)
    for key in ("training_s", "checkpointing_s", "checkpoints"):
        assert with_dark["run"][key] == pytest.approx(without["run"][key], rel=1e-9), key
    assert with_dark["throughput"] == without["throughput"]


def test_the_wall_clock_prices_of_light_and_detailed_steps_are_measured_in_the_run(tmp_path: Path) -> None:
    """A light step that costs the user 20 us more than a dark one, and a detailed step 200 us more than a light
    one: the paired prices find both, and the measured share is what they cost the run."""
    live: list[float] = []
    report = run(tmp_path, dark=True, light_ms=0.02, detailed_ms=0.2, live=live)
    overhead = report["overhead"]
    measured = overhead["measured"]
    assert measured["light_over_dark"]["mean_us"] == pytest.approx(20.0, abs=0.01)
    assert measured["detailed_over_light"]["mean_us"] == pytest.approx(200.0, abs=0.01)
    light, detailed, dark = overhead["light_steps"], overhead["detailed_steps"], overhead["dark_steps"]
    assert light + detailed + dark == STEPS
    cost_us = (light + detailed) * 20.0 + detailed * 200.0
    wall_us = report["step_ms"]["mean"] * STEPS * 1e3
    assert measured["share"] == pytest.approx(cost_us / wall_us, rel=1e-3)
    assert measured["resolved"] and measured["low"] <= measured["share"] <= measured["high"]
    assert overhead["kept_on"] == "measured" and overhead["kept"] is (measured["share"] <= 0.01)
    assert live == [pytest.approx(measured["share"], rel=1e-3)], "perfhooks top shows the measured share"
    # perfhooks' own time in place is not what these steps cost the run: the measured figure is
    assert measured["share"] > overhead["share_of_run"]


def test_without_dark_steps_the_measured_share_is_unresolved_and_the_in_place_figure_is_said(tmp_path: Path) -> None:
    report = run(tmp_path, dark=False, steps=2000)
    measured = report["overhead"]["measured"]
    assert measured["light_over_dark"] is None and not measured["resolved"]
    assert measured["share"] == report["overhead"]["share_of_run"]
    assert report["overhead"]["kept_on"] == "in_place"
