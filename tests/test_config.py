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
    ({"max_traces": None}, ValueError, "max_traces must be an integer >= 1"),
    ({"max_traces": "5"}, ValueError, "max_traces must be an integer >= 1"),
    ({"max_memory_captures": -3}, ValueError, "max_memory_captures must be an integer >= 1"),
    ({"memory_history_entries": 0}, ValueError, "memory_history_entries must be an integer >= 1"),
    ({"memory_threshold": 0}, ValueError, r"memory_threshold must be a fraction in \(0, 1\]"),
    ({"memory_threshold": 1.5}, ValueError, r"memory_threshold must be a fraction in \(0, 1\]"),
    ({"memory_threshold": float("nan")}, ValueError, r"memory_threshold must be a fraction in \(0, 1\]"),
    ({"memory_threshold": "0.9"}, ValueError, r"memory_threshold must be a fraction in \(0, 1\]"),
    ({"memory_capacity_bytes": 0}, ValueError, "memory_capacity_bytes must be an integer >= 1 or None"),
    ({"memory_capacity_bytes": 1e9}, ValueError, "memory_capacity_bytes must be an integer >= 1 or None"),
    ({"memory_poll_s": -0.1}, ValueError, "memory_poll_s must be a finite number of seconds >= 0"),
    ({"memory_poll_s": float("inf")}, ValueError, "memory_poll_s must be a finite number of seconds >= 0"),
    ({"trigger_poll_s": -1}, ValueError, "trigger_poll_s must be a finite number"),
    ({"console": 1}, TypeError, "console must be True or False"),
    ({"memory": None}, TypeError, "memory must be True or False"),
    ({"thresholds": {"dataloader_share": 0.1}}, TypeError, "thresholds must be a perfhooks.rules"),
    ({"wandb": "yes"}, TypeError, "wandb must be True, False or None"),
    ({"wandb_run": "my-run"}, TypeError, "wandb_run must be a wandb Run"),
    ({"wandb": False, "wandb_run": type("Run", (), {"log": lambda self: None})()}, ValueError,
     "wandb=False and a wandb_run contradict"),
    ({"wandb_log_every": 0}, ValueError, "wandb_log_every must be an integer >= 1"),
    ({"wandb_queue": -1}, ValueError, "wandb_queue must be an integer >= 1"),
])
def test_bad_values_name_the_parameter(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PerfConfig(**kwargs)


def test_unknown_argument_lists_the_allowed_ones() -> None:
    with pytest.raises(TypeError, match=r"PerfCallback got unknown argument\(s\) max_trace\b.*allowed: .*max_traces"):
        PerfConfig.from_kwargs("PerfCallback", {"max_trace": 3})


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"active": 0}, "active must be an integer >= 1"),
    ({"warmup": -1}, "warmup must be an integer >= 0"),
    ({"repeat": 1.5}, "repeat must be an integer >= 0"),
    ({"skip_first": True}, "skip_first must be an integer >= 0"),
])
def test_bad_schedules_name_the_parameter(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        Schedule(**kwargs)


def test_long_run_settings_name_their_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfhooks import PerfConfig
    from perfhooks.cli.launch import settings_from
    from perfhooks.cli.main import build_parser

    config = PerfConfig()
    assert (config.report_every_s, config.signals, config.stall_after_s) == (60.0, ("SIGTERM", "SIGHUP", "SIGINT"),
                                                                              None)
    assert PerfConfig(signals="term, USR1", report_every_s=0).signals == ("SIGTERM", "SIGUSR1")
    assert PerfConfig(signals=()).signals == ()
    monkeypatch.setenv("PERFHOOKS_REPORT_EVERY_S", "soon")
    with pytest.raises(ValueError, match="PERFHOOKS_REPORT_EVERY_S must be a number of seconds >= 0, got 'soon'"):
        PerfConfig()
    monkeypatch.setenv("PERFHOOKS_REPORT_EVERY_S", "5")
    monkeypatch.setenv("PERFHOOKS_STALL_AFTER_S", "30")
    assert (PerfConfig().report_every_s, PerfConfig().stall_after_s) == (5.0, 30.0)
    with pytest.raises(ValueError, match="stall_after_s must be a finite number of seconds >= 0, got -1"):
        PerfConfig(stall_after_s=-1)
    with pytest.raises(ValueError, match=r"^signals: 'SIGKILL' is not a signal perfhooks can handle"):
        PerfConfig(signals=["SIGKILL"])
    args = build_parser().parse_args(["run", "--signals", "term,bogus", "train.py"])
    with pytest.raises(ValueError, match=r"^--signals: 'bogus' is not a signal"):
        settings_from(args, environ={})
