import pytest

from perfhooks import PerfConfig, Schedule
from perfhooks.config import DEFAULT_SCHEDULE


def test_defaults() -> None:
    config = PerfConfig()
    assert config.schedule == DEFAULT_SCHEDULE
    assert PerfConfig(schedule=None).schedule is None
    assert PerfConfig(schedule=Schedule(active=1)).schedule.active == 1


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"max_traces": 0}, ValueError, "max_traces must be an integer >= 1"),
    ({"max_traces": 2.5}, ValueError, "max_traces must be an integer >= 1"),
    ({"max_trace_bytes": -1}, ValueError, "max_trace_bytes must be an integer >= 1"),
    ({"on_demand_active": True}, ValueError, "on_demand_active must be an integer >= 1"),
    ({"trigger_poll_s": 0}, ValueError, "trigger_poll_s must be a finite number"),
    ({"trigger_poll_s": float("nan")}, ValueError, "trigger_poll_s must be a finite number"),
    ({"nvtx": "yes"}, TypeError, "nvtx must be True or False"),
    ({"schedule": {"active": 3}}, TypeError, "schedule must be a perfhooks.Schedule or None"),
    ({"output_dir": 3}, TypeError, "output_dir must be a path"),
])
def test_bad_values_name_the_parameter(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PerfConfig(**kwargs)


def test_unknown_argument_lists_the_allowed_ones() -> None:
    with pytest.raises(TypeError, match=r"PerfCallback got unknown argument\(s\) max_trace\b.*allowed: .*max_traces"):
        PerfConfig.from_kwargs("PerfCallback", {"max_trace": 3})
