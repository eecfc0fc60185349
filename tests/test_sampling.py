"""Light steps and detailed steps (issue 65): every step counted, phases on steps drawn at random gaps, and the
budget that sets how many, on a clock the test moves by hand."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from helpers import ManualClock, framework_step
from perfhooks import Engine, PerfConfig
from perfhooks.config import overhead_budget
from perfhooks.report.schema import validate_report
from perfhooks.runtime.step.sampling import DETAILED_EVERY_S, StepSampler

STEPS = 20_000
#: The optimizer step is slow every 50th step (the shape of periodic logging).
SLOW_EVERY, SLOW_MS, USUAL_MS = 50, 6.0, 1.0


def run(tmp_path: Path, budget: float | None, hold: float | None = None, steps: int = STEPS) -> dict[str, Any]:
    clock = ManualClock()
    config = PerfConfig(schedule=None, console=False, on_demand=False, memory=False, overhead_budget=budget)
    engine = Engine(config, tmp_path, "test", clock=clock)
    if hold is not None:
        engine.tracker.sampler.hold(hold)
    for step in range(steps):
        framework_step(engine, clock, callbacks_ms=0.5,
                       optimizer_ms=SLOW_MS if step % SLOW_EVERY == SLOW_EVERY - 1 else USUAL_MS)
    report = engine.close()
    assert report is not None
    return report


def test_phases_from_a_random_sample_match_every_step_detailed_and_every_step_is_counted(tmp_path: Path) -> None:
    """Sampled about 1 step in 10, the optimizer's mean and p95 are within 5% of every step detailed: the periodic
    slow step neither aliases with the sample nor escapes it. Step time and data wait count every step, exactly."""
    every = run(tmp_path / "every", budget=None)
    sampled = run(tmp_path / "sampled", budget=0.01, hold=0.1)
    for report in (every, sampled):
        assert validate_report(report) == []
        assert report["steps"] == STEPS
        slow_share = 1 / SLOW_EVERY
        assert report["step_ms"]["mean"] == pytest.approx(8 + USUAL_MS + slow_share * (SLOW_MS - USUAL_MS))
        assert report["data_fetch_ms"]["mean"] == pytest.approx(0.5)
    assert every["phase_steps"] == STEPS and every["overhead"]["light_steps"] == 0
    assert every["overhead"]["budget"] is None and every["overhead"]["kept"] is None
    detailed = sampled["phase_steps"]
    assert 0.08 * STEPS < detailed < 0.12 * STEPS, detailed
    assert sampled["overhead"]["detailed_steps"] == detailed
    assert sampled["overhead"]["light_steps"] + sampled["overhead"]["dark_steps"] == STEPS - detailed
    assert sampled["overhead"]["dark_steps"] > 0  # between detailed steps 10 apart on average: few blocks fit
    for key in ("mean_ms", "p95_ms"):
        assert sampled["phases"]["optimizer"][key] == pytest.approx(every["phases"]["optimizer"][key], rel=0.05)
    assert sampled["phases"]["forward"]["mean_ms"] == pytest.approx(3.0)
    assert sampled["phases"]["forward"]["share"] == pytest.approx(every["phases"]["forward"]["share"], rel=0.01)


def test_the_sample_has_random_gaps_never_every_nth_step() -> None:
    sampler = StepSampler(0.01, warmup_steps=0)
    sampler.hold(0.1)
    chosen = [step for step in range(10_000) if sampler.next_is_detailed(step, forced=False)]
    gaps = {b - a for a, b in itertools.pairwise(chosen)}
    assert 900 < len(chosen) < 1100
    assert len(gaps) > 20, "geometric gaps, not a period"
    # the slow every-50th steps are sampled at the sample's own rate
    slow = sum(1 for step in chosen if step % SLOW_EVERY == SLOW_EVERY - 1)
    assert slow == pytest.approx(len(chosen) / SLOW_EVERY, rel=0.5)


def test_a_forced_step_is_detailed_and_the_warmup_is() -> None:
    sampler = StepSampler(0.01, warmup_steps=5)
    sampler.hold(1e-9)
    assert all(sampler.next_is_detailed(step, forced=False) for step in range(5))
    assert not any(sampler.next_is_detailed(step, forced=False) for step in range(5, 100))
    assert sampler.next_is_detailed(100, forced=True)
    assert all(StepSampler(None).next_is_detailed(step, forced=False) for step in range(100))


#: :func:`feed`'s blocks: 16 steps (15 light, the middle one detailed), then a dark block of 64.
BLOCKS = 12
LIGHT_SEEN = 15 / (15 + 64)  # the light steps' share of the light and dark ones


def feed(sampler: StepSampler, step_ms: float, detailed_us: float, light_us: float) -> None:
    """:data:`BLOCKS` blocks of 16 steps of ``step_ms`` plus 3 us (light ones, and a detailed one in the middle that
    its neighbours price at 40 us in place and 0 on the wall clock), each followed by a dark block of 64 steps of
    ``step_ms``: a light step costs 3 us over a dark one on the wall clock. Own costs as given; fed in the warm-up,
    so that the chance is set once, by the test."""
    now = step = 0
    wall = int((step_ms + 3e-3) * 1e6)
    for _ in range(BLOCKS):
        for index in range(16):
            detailed = index == 8
            now += wall
            sampler.step_ended(detailed, int((detailed_us if detailed else light_us) * 1e3), wall, detailed, step,
                               now)
            step += 1
        dark_wall = 64 * int(step_ms * 1e6)
        now += dark_wall
        sampler.dark_ended(64, dark_wall, [wall] * 15, step + 63, now)
        step += 64


def light_steps(dark: float) -> float:
    """The share of steps that are light when a block is dark with chance ``dark`` (light blocks of 16 steps, dark
    ones of 64)."""
    return 16 * (1 - dark) / (16 * (1 - dark) + 64 * dark)


@pytest.mark.parametrize(("step_ms", "dark"), [
    (1.5, 0.5),  # a launch-bound step: light steps (3 us) fit in half the budget at the least dark share
    (0.2, 0.5),  # a shorter one: half the budget is a third of the steps light (1 us of 3); a fifth are
    (35.0, 0.5),  # a GPT's step: every step detailed at the default budget, half the light blocks dark
    (0.06, 16 * 0.9 / (16 * 0.9 + 64 * 0.1)),  # a tenth of the steps light for half the budget: 69% of the blocks
    (0.01, 0.9),  # a sub-millisecond step: the most blocks dark (3% of the steps light)
    (0.002, 0.9),  # a shorter one: light steps alone spend more than the budget; detailed steps at their floor
])
def test_the_chance_follows_the_budget(step_ms: float, dark: float) -> None:
    """Priced on the wall clock (a light step 3 us over a dark one, a detailed step 37 us over a light one in place
    and 0 paired: the larger), light steps take at most half the budget (the rest of their blocks dark), and
    p = (budget x step - light share x light cost) / detailed cost, at least one detailed step every 0.25 s of
    steps; the light share is the larger of the blocks' and the one seen."""
    sampler = StepSampler(0.01, warmup_steps=10_000)
    feed(sampler, step_ms, detailed_us=40.0, light_us=3.0)
    sampler.adjust(10_000)
    step_ns = step_ms * 1e6 + 3e3 * 16 / 80  # a fifth of the steps are 3 us longer
    wanted = min(1.0, 0.5 * 0.01 * step_ns / 3e3)  # the light steps' share that spends half the budget
    blocks = 16 * (1 - wanted) / (16 * (1 - wanted) + 64 * wanted)  # the chance of a dark block that gives it
    assert sampler.dark_share == pytest.approx(min(0.9, max(0.5, blocks)), rel=1e-9)
    assert sampler.dark_share == pytest.approx(dark, rel=1e-2)
    light_share = max(light_steps(dark), LIGHT_SEEN)
    expected = min(1.0, max(step_ns / (DETAILED_EVERY_S * 1e9), (0.01 * step_ns - light_share * 3e3) / 37e3))
    assert sampler.probability == pytest.approx(expected, rel=1e-6)
    if step_ms == 0.002:
        assert expected == step_ns / (DETAILED_EVERY_S * 1e9)
    section = sampler.section()
    assert section["in_place_us"] == {"detailed": 40.0, "light": 3.0}
    share = BLOCKS * (40e3 + 15 * 3e3) / (BLOCKS * 80 * step_ns)
    assert section["share_of_run"] == pytest.approx(share, abs=1e-6)
    measured = section["measured"]
    assert measured["light_over_dark"]["mean_us"] == pytest.approx(3.0)
    assert measured["detailed_over_light"]["mean_us"] == 0.0


def test_an_unpriced_tier_gets_the_least(tmp_path: Path) -> None:
    """Before a tier is priced on the wall clock (10 pairs), the governor spends as little on it as it may: detailed
    steps at their floor, dark blocks at their most, whatever the in-place prices would afford."""
    sampler = StepSampler(0.01, warmup_steps=10)
    now = 0
    for step in range(400):  # a 35 ms step: in place, every step could be detailed
        now += 35_000_000
        detailed = sampler.next_is_detailed(step, forced=False)
        sampler.step_ended(detailed, 40_000 if detailed else 3_000, 35_000_000, detailed, step, now)
    assert sampler.dark_share == 0.9
    assert sampler.changes[0] == (10, round(35e6 / (DETAILED_EVERY_S * 1e9), 4))
    assert sampler.section()["paired"] is not None, "priced by its light neighbours"
    assert sampler.probability == 1.0, "then every step, as the budget affords"


def test_the_paired_difference_is_a_detailed_step_against_its_light_neighbours() -> None:
    sampler = StepSampler(0.01, warmup_steps=0, adjust_every_s=1000.0)
    walls = [1000, 1100, 1000] * 12 + [1000]  # light, detailed, light, ...: each detailed step 100 ns longer
    for step, wall in enumerate(walls):
        sampler.step_ended(step % 3 == 1, 0, wall, True, step, step)
    paired = sampler.section()["paired"]
    assert paired["pairs"] == 12 and paired["mean_us"] == pytest.approx(0.1)
    assert paired["low_us"] == pytest.approx(0.1) and paired["high_us"] == pytest.approx(0.1)
    assert StepSampler(0.01).section()["paired"] is None, "too few pairs: null"


def test_the_budget_setting_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert PerfConfig().overhead_budget == 0.01
    assert PerfConfig(overhead_budget=None).overhead_budget is None
    assert PerfConfig(overhead_budget=0.05).overhead_budget == 0.05
    monkeypatch.setenv("PERFHOOKS_OVERHEAD_BUDGET", "none")
    assert PerfConfig().overhead_budget is None
    monkeypatch.setenv("PERFHOOKS_OVERHEAD_BUDGET", "0.02")
    assert PerfConfig().overhead_budget == 0.02
    monkeypatch.setenv("PERFHOOKS_OVERHEAD_BUDGET", "lots")
    with pytest.raises(ValueError, match="PERFHOOKS_OVERHEAD_BUDGET must be a share of the step in"):
        PerfConfig()
    for bad in (0, 1.5, -0.1, True, math.nan):
        with pytest.raises(ValueError, match="overhead_budget must be a share of the step in"):
            overhead_budget(bad)


def test_drawn_detailed_steps_publish_on_the_light_steps_cadence_and_the_warm_up_every_step(tmp_path: Path) -> None:
    """The run's state is published at each step's end in the sampler's warm-up; past it, a detailed step the sampler
    drew publishes as a light one does, every 20 ms of the steps' clock at most (8.5 ms steps: every third), unless
    a window's verdicts were just swapped in (the next step publishes them). There is no W&B run: no step is made
    to publish for rows."""
    from perfhooks.runtime.step.tracker import LIGHT_PUBLISH_EVERY_NS

    clock = ManualClock()
    config = PerfConfig(schedule=None, console=False, on_demand=False, memory=False)
    engine = Engine(config, tmp_path, "test", clock=clock)
    engine.tracker.sampler.hold(1.0)  # every step detailed, drawn (not forced)
    warmup = engine.tracker.sampler.warmup_steps
    published = []
    for step in range(warmup + 40):
        before = engine.state
        framework_step(engine, clock)  # its fetch ends the step before
        if engine.state is not before:
            published.append(engine.tracker.step)
        if step == warmup + 30:
            engine.saving.on_verdicts()  # the writer thread swapped a window's verdicts in
    engine.close()
    assert LIGHT_PUBLISH_EVERY_NS == 20_000_000
    assert published[:warmup] == list(range(1, warmup + 1))
    later = [step for step in published if step > warmup]
    assert later[:9] == list(range(warmup + 3, warmup + 30, 3)), later
    assert [step for step in later if step > warmup + 29][:3] == [warmup + 30, warmup + 31, warmup + 34], later
    assert engine.tracker.publish_at_step == 1 << 62


def test_samples_and_tokens_per_step_are_of_the_steps_whose_batches_were_counted(tmp_path: Path) -> None:
    """A light step's batch is not counted: samples and tokens per step are the detailed steps' (a gate that compared
    samples per step read 15.73 for batches of 16 once some steps were light), and samples per second is at
    every step's rate."""
    import torch

    clock = ManualClock()
    config = PerfConfig(schedule=None, console=False, on_demand=False, memory=False)
    engine = Engine(config, tmp_path, "test", clock=clock)
    engine.tracker.sampler.hold(0.25)
    batch = torch.zeros(16, 4)
    for _ in range(400):
        engine.fetch()
        clock.advance(0.5)
        engine.phase_start("forward")
        engine.batch(batch)
        clock.advance(9.5)
        engine.phase_end("forward")
        engine.stepped()
    report = engine.close()
    assert report is not None
    throughput = report["throughput"]
    assert report["overhead"]["light_steps"] > 0 and report["phase_steps"] < report["steps"]
    assert throughput["samples_per_step"] == 16.0
    assert throughput["samples_per_s"] == pytest.approx(16 / 0.010, rel=1e-3)
