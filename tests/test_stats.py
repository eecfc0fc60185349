import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfhooks.report.statistics import StreamingStats

durations = st.lists(st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False),
                     min_size=1, max_size=400)


def brute_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@given(durations, st.sampled_from([0.0, 0.5, 0.95, 0.99, 1.0]))
def test_quantiles_within_one_percent_of_brute_force(values: list[float], q: float) -> None:
    stats = StreamingStats()
    for value in values:
        stats.add(value)
    exact = brute_quantile(values, q)
    assert stats.quantile(q) == pytest.approx(exact, rel=0.0101, abs=1e-6)


@given(durations)
def test_count_mean_max_are_exact(values: list[float]) -> None:
    stats = StreamingStats()
    for value in values:
        stats.add(value)
    assert stats.count == len(values)
    assert stats.mean == pytest.approx(sum(values) / len(values), rel=1e-9, abs=1e-9)
    assert stats.maximum == max(values)


@given(durations, durations)
def test_merge_equals_one_stream(left: list[float], right: list[float]) -> None:
    a, b, both = StreamingStats(), StreamingStats(), StreamingStats()
    for value in left:
        a.add(value)
        both.add(value)
    for value in right:
        b.add(value)
        both.add(value)
    a.merge(b)
    assert a.count == both.count and a.maximum == both.maximum
    for q in (0.5, 0.95):
        assert a.quantile(q) == both.quantile(q)


def test_memory_is_bounded_by_spread_not_length() -> None:
    stats = StreamingStats()
    for i in range(200_000):
        stats.add(10.0 + (i % 1000) / 100.0)  # 10..20 ms
    assert stats.count == 200_000
    assert len(stats._buckets) <= 40  # log(2)/log(1.02) ~ 35 buckets


def test_summary_keys_and_empty() -> None:
    assert StreamingStats().summary("_ms") == {"count": 0, "mean_ms": 0.0, "p50_ms": 0.0, "p95_ms": 0.0,
                                               "max_ms": 0.0}
    with pytest.raises(ValueError, match="quantile q"):
        StreamingStats().quantile(1.5)


def test_a_diagnosis_has_one_title_in_a_run_and_in_analyze() -> None:
    """Issue 29, item 4: dataloader_bound read 'The training loop waits for data' in a run and 'Input pipeline holds
    the step back' in perfhooks analyze."""
    from perfhooks.report.statistics import PhaseStatistics, StepTiming
    from perfhooks.rules.live import diagnose_live
    from perfhooks.rules.trace import diagnose_trace

    stats = PhaseStatistics()
    for step in range(30):  # data wait 40% of each step, and every fifth step three times as long
        scale = 3.0 if step % 5 == 0 else 1.0
        stats.add(StepTiming(step, 10.0 * scale, {"data_wait": 4.0 * scale, "forward": 3.0 * scale,
                                                  "backward": 2.0 * scale, "optimizer": 1.0 * scale}, 1))
    live = {d["id"]: d["title"] for d in diagnose_live(stats)}
    spans = [10_000.0] * 9 + [40_000.0] * 3
    trace = {d["id"]: d["title"] for d in diagnose_trace({
        "steps": 12, "step_us": sum(spans) / 12, "breakdown": {"dataloader": 6_000.0},
        "step_us_p50": 10_000.0, "step_us_p95_over_p50": 4.0, "compile": {"compiling_in_window": True}})}
    assert {"dataloader_bound", "step_time_variance"} <= set(live) & set(trace)
    for rule in ("dataloader_bound", "step_time_variance"):
        assert live[rule] == trace[rule], rule


@given(st.lists(st.floats(min_value=-1.0, max_value=1e6, allow_nan=False, allow_infinity=False), max_size=200))
def test_add_many_keeps_the_summary_add_keeps(values: list[float]) -> None:
    """The fold's batch path (C-level maps) lands every value where ``add`` does: buckets, extremes, kept values."""
    one, many = StreamingStats(), StreamingStats()
    for value in values:
        one.add(value)
    many.add_many(values)
    assert (many.count, many.maximum, many.minimum) == (one.count, one.maximum, one.minimum)
    assert many._buckets == one._buckets and many._values == one._values
    assert many.total == pytest.approx(one.total, rel=1e-12, abs=1e-9)


def test_values_are_kept_then_bucketed_past_the_exact_limit_the_same_whichever_way_they_came() -> None:
    """While values are kept (the run's first EXACT_VALUES), the quantiles read them and nothing is bucketed (no
    logarithm a step); past the limit every kept value goes into the buckets, as if each had been bucketed on
    arrival: one by one, in batches, in ns or by merging, the buckets agree."""
    from perfhooks.report.statistics import EXACT_VALUES

    values_ns = [1_000_000 + (i * 7919) % 500_000 for i in range(EXACT_VALUES + 300)]
    one, many, in_ns, merged = StreamingStats(), StreamingStats(), StreamingStats(), StreamingStats()
    for value in values_ns[:EXACT_VALUES]:
        one.add(value / 1e6)
    many.add_many([value / 1e6 for value in values_ns[:EXACT_VALUES]])
    in_ns.add_many_ns(values_ns[:EXACT_VALUES])
    assert one._buckets == many._buckets == in_ns._buckets == {}
    assert one.quantile(0.5) == many.quantile(0.5) == in_ns.quantile(0.5)
    half = StreamingStats()
    half.add_many([value / 1e6 for value in values_ns[EXACT_VALUES // 2:]])
    merged.add_many([value / 1e6 for value in values_ns[:EXACT_VALUES // 2]])
    merged.merge(half)
    for value in values_ns[EXACT_VALUES:]:
        one.add(value / 1e6)
    many.add_many([value / 1e6 for value in values_ns[EXACT_VALUES:]])
    in_ns.add_many_ns(values_ns[EXACT_VALUES:])
    for stats in (one, many, in_ns, merged):
        assert stats._values is None and stats.count == len(values_ns)
    assert one._buckets == many._buckets == in_ns._buckets == merged._buckets
    assert sum(one._buckets.values()) == len(values_ns)
