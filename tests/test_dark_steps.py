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
    # no report write while the steps run (the first answer's is off): a step its real-time writer overlaps is
    # perfhooks' own, and the two runs' steady steps would differ by that
    config = PerfConfig(schedule=None, console=False, on_demand=False, memory=False, overhead_budget=0.01,
                        first_answer_step=None)
    engine = Engine(config, tmp_path, "test", clock=clock)
    sampler = engine.tracker.sampler
    sampler.hold(0.01)
    if not dark:
        sampler.dark_share = 0.0
    tracker = engine.tracker
    for step in range(steps):
        if tracker.light and not tracker.dark_left:
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


def profiled_linear(tmp_path: Path, dark: bool = True) -> tuple[Any, Any, Any]:
    """A one-layer model and SGD under ``perfhooks.profile`` (no window), every step after the warm-up light, and
    every block that may be dark dark (or none): ``(perf, model, optimizer)``."""
    import torch

    import perfhooks

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    perf = perfhooks.profile(model, optimizer, output_dir=tmp_path, schedule=None, console=False, on_demand=False)
    sampler = perf.engine.tracker.sampler
    sampler.hold(0.0)
    sampler.dark_share = 1.0 if dark else 0.0
    return perf, model, optimizer


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
    # and perfhooks' own time at the blocks' ends and on the long path, in place (no paired wall holds it)
    assert 0 < measured["boundaries_share"] < 1e-3
    assert measured["share"] == pytest.approx(cost_us / wall_us + measured["boundaries_share"], abs=2e-6)
    assert measured["resolved"] and measured["low"] <= measured["share"] <= measured["high"]
    assert overhead["kept_on"] == "measured" and overhead["kept"] is (measured["share"] <= 0.01)
    # the dark block open at the last publication is counted at the close
    assert live == [pytest.approx(measured["share"], rel=1e-2)], "perfhooks top shows the measured share"
    # perfhooks' own time in place is not what these steps cost the run: the measured figure is
    assert measured["share"] > overhead["share_of_run"]


def test_without_dark_steps_the_measured_share_is_unresolved_and_the_in_place_figure_is_said(tmp_path: Path) -> None:
    report = run(tmp_path, dark=False, steps=2000)
    measured = report["overhead"]["measured"]
    assert measured["light_over_dark"] is None and not measured["resolved"]
    assert measured["share"] == report["overhead"]["share_of_run"]
    assert report["overhead"]["kept_on"] == "in_place"


def test_the_long_path_comes_as_often_as_its_cost_allows(tmp_path: Path) -> None:
    """The long path (light steps folded, the run's state published, a step's opening) is taken every 20 ms at
    most, and further apart as it costs more in place, so that it stays within 0.05% of the steps' clock; never more
    than a second apart (a signal's report may miss the last second of steps)."""
    from perfhooks.runtime.step.tracker import LIGHT_PUBLISH_EVERY_NS, LONG_PATH_SHARE, PUBLISH_EVERY_MAX_NS

    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory=False), tmp_path, "test",
                    clock=ManualClock())
    tracker = engine.tracker
    assert tracker.publish_every_ns == LIGHT_PUBLISH_EVERY_NS == 20_000_000
    tracker._long_path_took(5_000)  # 5 us: 10 ms would do; 20 ms is the least
    assert tracker.publish_every_ns == 20_000_000
    tracker._long_path_took(100_000)  # a running mean: 0.75 x 5 us + 0.25 x 100 us
    assert tracker.publish_every_ns == int((0.75 * 5_000 + 0.25 * 100_000) / LONG_PATH_SHARE) == 57_500_000
    for _ in range(40):
        tracker._long_path_took(200_000)
    assert tracker.publish_every_ns == pytest.approx(200_000 / LONG_PATH_SHARE, rel=1e-3)  # 400 ms
    tracker._long_path_took(50_000_000)
    assert tracker.publish_every_ns == PUBLISH_EVERY_MAX_NS == 1_000_000_000
    engine.close()


def test_the_steps_that_overlapped_perfhooks_own_work_are_priced_against_the_steady_ones() -> None:
    """``overhead.windows``: what the steps a window or an export overlapped took beyond a steady step's median."""
    from perfhooks.report.statistics import PhaseStatistics
    from perfhooks.runtime.state.reporting import windows_cost

    stats = PhaseStatistics()
    for _ in range(100):
        stats.add_light(10_000_000, 0, 1, False, False)
    for wall_ms in (30, 25, 45):  # a window's steps and its export's
        stats.add_light(wall_ms * 1_000_000, 0, 1, True, False)
    stats.add_dark(64, 64 * 10_000_000, own=False)
    cost = windows_cost([], stats)
    assert cost["steps"] == 3
    assert cost["added_s"] == pytest.approx(0.070)
    assert cost["time_share"] == pytest.approx(0.070 / (1.0 + 0.1 + 0.64), rel=1e-5)


def test_the_summary_names_the_steps_that_hold_the_cost_when_they_are_not_the_median_ones() -> None:
    from perfhooks.sinks.console import overhead_line

    overhead = {"budget": 0.01, "detailed_steps": 20, "light_steps": 0, "dark_steps": 0, "kept": False,
                "in_place_us": {"detailed": 3077.2, "light": None}, "share_of_run": 0.0537, "captures_share": 0.0054,
                "measured": {"resolved": False},
                "windows": {"count": 1, "steps": 12, "added_s": 1.43, "time_share": 0.0701}}
    line = overhead_line({"steps": 20, "phase_steps": 20, "overhead": overhead})
    assert line is not None
    assert "every step detailed, as a run's first 50 are" in line
    assert "the 12 steps that overlapped capture windows and their exports took 1.43 s more than steady steps " \
           "(7.0% of the steps' time)" in line
    overhead["windows"].update(added_s=0.001, time_share=0.0001)
    assert "overlapped" not in (overhead_line({"steps": 20, "phase_steps": 20, "overhead": overhead}) or "")


@pytest.mark.parametrize("dark", [True, False])
def test_a_plain_loops_step_count_is_exact_across_evaluations_and_the_loaders_end(tmp_path: Path,
                                                                                  dark: bool) -> None:
    """A real ``perfhooks.profile`` loop, every block that may be dark dark (or none): the step count and the global
    step stay exact across evaluations, the loader's end inside a block and the close."""
    import torch

    perf, model, optimizer = profiled_linear(tmp_path, dark)
    data = [torch.randn(2, 4) for _ in range(2000)]
    for step, x in enumerate(perf.batches(data)):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 700 == 699:
            with perf.evaluation():
                model(data[0])
    report = perf.close()
    assert report["steps"] == report["global_step"] == 2000
    assert (report["overhead"]["dark_steps"] > 1000) is dark


def test_a_skipped_step_the_loop_ends_itself_ends_a_dark_block_exactly(tmp_path: Path) -> None:
    """A ``GradScaler`` that skips a step: the loop calls ``perf.step()`` for it (the optimizer's hook did not fire).
    Inside a dark block, that ends the block and the step, each counted once."""
    import torch

    perf, model, optimizer = profiled_linear(tmp_path)
    x = torch.randn(2, 4)
    for step in range(1500):
        with perf.data_wait():
            batch = x
        model(batch).square().mean().backward()
        if step % 97 == 96:  # the scaler found an inf: no optimizer step, the loop says the step ended
            perf.step()
        else:
            optimizer.step()
        optimizer.zero_grad()
    report = perf.close()
    assert report["steps"] == report["global_step"] == 1500
    assert report["overhead"]["dark_steps"] > 500


def test_wandbs_figures_table_says_what_perfhooks_cost_and_the_windows_time(tmp_path: Path) -> None:
    """The ``perf/figures`` table: the measured share once resolved, and the windows' steps beyond steady ones."""
    from perfhooks.sinks.wandb import _figures_table

    report = run(tmp_path, dark=True, light_ms=0.02, detailed_ms=0.2)
    rows = dict(_figures_table(report, {})().data)
    overhead = report["overhead"]
    assert rows["perf/overhead/measured"] == str(overhead["measured"]["share"])
    assert rows["perf/overhead/windows_time_share"] == str(overhead["windows"]["time_share"])


def test_the_plain_loops_fast_path_through_a_dark_block_stops_at_a_wake_and_fits_its_horizon(tmp_path: Path) -> None:
    """The plain loop ends a dark block's steps on a small object of its own, reading no clock (the tracker's state
    is left cold). A signal's wake (another thread, or a handler: one attribute write) ends the block at the next
    step; and a block is drawn only as long as the steps fit before the next long path."""
    import torch

    perf, model, optimizer = profiled_linear(tmp_path)
    tracker = perf.engine.tracker
    x = torch.randn(2, 4)
    woken = None
    for step in range(400):
        with perf.data_wait():
            batch = x
        if woken is None and tracker.fast.left > 3:  # in a block, on the fast path
            woken, left = step, tracker.dark_left
            tracker.wake()
            assert tracker.fast.open is False
        elif woken is not None and step == woken + 1:
            assert tracker.dark_left == 0 and tracker.fast.left == 0, "the block ended at the step after the wake"
            assert tracker.step == step, "every step it ended counted"
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    report = perf.close()
    assert woken is not None and left > 3
    assert report["steps"] == report["global_step"] == 400

    # a block must fit before the next long path: with steps of 10 ms and 50 ms left, none is drawn
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory=False), tmp_path / "cap", "test")
    tracker = engine.tracker
    tracker.fast_path = True
    tracker.sampler.dark_share = 1.0
    tracker._short_left = 100
    tracker._short_walls = [10_000_000]
    tracker._short_until_ns = __import__("time").monotonic_ns() + 50_000_000
    tracker._maybe_dark(0)
    assert tracker.dark_left == 0
    tracker._short_until_ns += 10**9  # a second more: a block of up to 64 steps
    tracker._maybe_dark(0)
    assert 16 < tracker.dark_left <= 64 and tracker.fast.left == tracker.dark_left
    engine.close()


def test_a_second_fetch_in_a_step_inside_a_dark_block_counts_exactly_and_prices_nothing(tmp_path: Path) -> None:
    """A loop that sometimes fetches twice in a step: inside a dark block, the second fetch ends the block there
    (the step in progress turns light); the step count stays exact, and the block, whose last step's end was not
    read on the fast path, prices no light step."""
    import torch

    perf, model, optimizer = profiled_linear(tmp_path)
    tracker = perf.engine.tracker
    x = torch.randn(2, 4)
    doubled = 0
    for step in range(1200):
        with perf.data_wait():
            batch = x
        if tracker.fast.left > 3 and step % 5 == 0:  # on the fast path: a second fetch before the step
            pairs = tracker.sampler._dark_pairs
            with perf.data_wait():
                batch = x
            assert tracker.dark_left == 0 and tracker.sampler._dark_pairs == pairs
            doubled += 1
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    report = perf.close()
    assert doubled > 3
    assert report["steps"] == report["global_step"] == 1200
    assert report["micro_batches"] == 1200 + doubled
