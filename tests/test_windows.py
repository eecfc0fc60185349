import os
import signal
import time
import warnings
from pathlib import Path

import pytest
import torch

from helpers import annotation_names, load_trace, plain_loop
from perfhooks import Engine, PerfConfig, PerfhooksWarning, Schedule


def engine_for(tmp_path: Path, **settings) -> Engine:
    settings.setdefault("console", False)
    return Engine(PerfConfig(**settings), tmp_path, "test")


def trace_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "traces").iterdir())


@pytest.mark.parametrize("profile_memory", [None, True])
def test_a_default_window_records_no_allocation_events(tmp_path: Path, profile_memory: bool | None) -> None:
    """profile_memory is off by default, as in torch.profiler and its peers (an event per allocation makes each
    window heavier); asked for, it is on."""
    settings = {} if profile_memory is None else {"profile_memory": profile_memory}
    engine = engine_for(tmp_path, schedule=Schedule(skip_first=1, warmup=1, active=2, repeat=1), **settings)
    plain_loop(engine, steps=5)
    engine.close()
    (path,) = (tmp_path / "traces").glob("*.gz")
    memory_events = [e for e in load_trace(path)["traceEvents"] if e.get("name") == "[memory]"]
    assert bool(memory_events) is bool(profile_memory), len(memory_events)


def test_what_a_killed_export_left_is_swept_and_a_live_ones_files_stay(tmp_path: Path) -> None:
    """An export killed at the exit deadline leaves torch's raw JSON (named with its pid) and the gzip's temp file;
    pruning never matched them, so they piled up (possibly gigabytes). The next window's prune deletes those of
    a dead process and old temp files of this rank; a live process's and another rank's stay."""
    import subprocess
    import sys

    traces = tmp_path / "traces"
    traces.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    left = {f".rank0.step3.pt.trace.json.gz.{dead}.json": 0, ".rank0.step3.pt.trace.json.gz.ab12cd.tmp": 3600,
            f".rank0.step9.pt.trace.json.gz.{os.getppid()}.json": 0,  # a live process: still exporting
            ".rank0.step9.pt.trace.json.gz.ef34gh.tmp": 0,  # just made: being written
            f".rank1.step3.pt.trace.json.gz.{dead}.json": 0}  # another rank's: its own run sweeps it
    for name, age_s in left.items():
        (traces / name).write_text("{}")
        os.utime(traces / name, (time.time() - age_s, time.time() - age_s))
    engine = engine_for(tmp_path, schedule=Schedule(skip_first=1, warmup=1, active=1, repeat=1))
    plain_loop(engine, steps=4)
    engine.close()
    assert sorted(p.name for p in traces.iterdir()) == sorted([
        f".rank0.step9.pt.trace.json.gz.{os.getppid()}.json", ".rank0.step9.pt.trace.json.gz.ef34gh.tmp",
        f".rank1.step3.pt.trace.json.gz.{dead}.json", "rank0.step2.pt.trace.json.gz"])


def test_scheduled_window_writes_a_standard_trace(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, schedule=Schedule(skip_first=2, wait=0, warmup=1, active=2, repeat=1))
    plain_loop(engine, steps=7)
    engine.writer.flush()
    assert (tmp_path / "report.json").exists(), "the report is written at the window's end, before close"
    report = engine.close()
    assert trace_files(tmp_path) == ["rank0.step3.pt.trace.json.gz"]
    trace = load_trace(tmp_path / "traces" / "rank0.step3.pt.trace.json.gz")
    assert trace["distributedInfo"]["rank"] == 0
    names = annotation_names(trace)
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#3", "ProfilerStep#4"]
    for phase in ("data_wait", "forward", "backward", "optimizer"):
        assert names.count(phase) == 2, phase
    window = report["windows"][0]
    assert len(report["windows"]) == 1
    assert {key: window[key] for key in ("path", "first_step", "last_step", "trigger", "pruned")} == {
        "path": str(tmp_path / "traces" / "rank0.step3.pt.trace.json.gz"), "first_step": 3, "last_step": 4,
        "trigger": "schedule", "pruned": False}
    metrics = window["metrics"]
    assert {key: metrics[key] for key in ("gpu_utilization", "sm_efficiency", "achieved_occupancy")} == \
        {"gpu_utilization": None, "sm_efficiency": None, "achieved_occupancy": None}, \
        "the window was analysed (a CPU trace has no GPU metrics)"
    assert metrics["top_kernels"] == [] and metrics["top_operators"], "host-timed operators on a CPU trace"
    assert all(0 < op["share"] <= 1 and op["ms_per_step"] > 0 for op in metrics["top_operators"])


def test_repeat_cycles_respect_max_traces(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, max_traces=2,
                        schedule=Schedule(skip_first=0, wait=1, warmup=0, active=1, repeat=0))
    plain_loop(engine, steps=10)
    report = engine.close()
    assert trace_files(tmp_path) == ["rank0.step7.pt.trace.json.gz", "rank0.step9.pt.trace.json.gz"]
    assert [w["first_step"] for w in report["windows"]] == [1, 3, 5, 7, 9]
    assert [w["pruned"] for w in report["windows"]] == [True, True, True, False, False]


def test_byte_cap_deletes_traces_over_it(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, max_trace_bytes=1, schedule=Schedule(skip_first=0, warmup=0, active=1))
    with pytest.warns(PerfhooksWarning, match="over max_trace_bytes"):
        plain_loop(engine, steps=3)
        engine.close()
    assert trace_files(tmp_path) == []


def test_trigger_file_opens_one_window_and_is_removed(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, schedule=None, trigger_poll_s=1e-6, on_demand_active=2)
    trigger = tmp_path / "TRIGGER"
    plain_loop(engine, steps=8, before_step=lambda step: step == 2 and trigger.touch())
    report = engine.close()
    assert not trigger.exists()
    assert report["windows"][0]["first_step"] == 3 and report["windows"][0]["last_step"] == 4
    assert report["windows"][0]["trigger"] == "on_demand"
    assert trace_files(tmp_path) == ["rank0.step3.pt.trace.json.gz"]


def test_the_output_folder_exists_from_the_start_so_the_trigger_can_be_touched(tmp_path: Path) -> None:
    """Issue 29, item 15: with schedule=None the folder was still missing at step 9, so `touch` failed."""
    out = tmp_path / "not" / "yet"
    engine = engine_for(out, schedule=None, trigger_poll_s=1e-6, on_demand_active=1)
    assert out.is_dir()
    plain_loop(engine, steps=4, before_step=lambda step: step == 1 and (out / "TRIGGER").touch())
    report = engine.close()
    assert [(w["first_step"], w["trigger"]) for w in report["windows"]] == [(2, "on_demand")]


def test_sigusr2_opens_a_window(tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGUSR2)
    engine = engine_for(tmp_path, schedule=None, on_demand_active=1)
    plain_loop(engine, steps=5, before_step=lambda step: step == 1 and os.kill(os.getpid(), signal.SIGUSR2))
    report = engine.close()
    assert [(w["first_step"], w["trigger"]) for w in report["windows"]] == [(2, "on_demand")]
    assert signal.getsignal(signal.SIGUSR2) == previous, "the previous handler is restored at close"


def test_schedule_none_keeps_timing_and_writes_no_trace(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, schedule=None, on_demand=False)
    plain_loop(engine, steps=4)
    report = engine.close()
    assert report["steps"] == 4 and report["windows"] == []
    assert not (tmp_path / "traces").exists()


def test_another_profiler_running_is_detected_once(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, schedule=Schedule(skip_first=0, warmup=0, active=2, repeat=0))
    with pytest.warns(PerfhooksWarning, match="another torch.profiler session") as caught, \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as theirs:
        plain_loop(engine, steps=4)
    report = engine.close()
    assert len([w for w in caught if "another torch.profiler" in str(w.message)]) == 1
    assert report["steps"] == 4 and report["windows"] == []
    assert "forward" in {e.name for e in theirs.events()}, "phase labels go into the user's own trace"


def test_no_temporary_files_are_left(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, schedule=Schedule(skip_first=0, warmup=1, active=1, repeat=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerfhooksWarning)
        plain_loop(engine, steps=6)
        engine.close()
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_exception_in_a_window_saves_the_partial_window(tmp_path: Path) -> None:
    engine = engine_for(tmp_path, schedule=Schedule(skip_first=1, warmup=0, active=5))
    plain_loop(engine, steps=3)
    engine.phase_start("forward")
    engine.exception(KeyboardInterrupt())
    assert trace_files(tmp_path) == ["rank0.step1.pt.trace.json.gz"]
    names = annotation_names(load_trace(tmp_path / "traces" / "rank0.step1.pt.trace.json.gz"))
    assert {"ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"} <= set(names)


def test_the_report_written_at_a_window_end_has_that_windows_analysis(tmp_path: Path) -> None:
    import json

    engine = engine_for(tmp_path, schedule=Schedule(skip_first=1, warmup=0, active=2))
    plain_loop(engine, steps=5)
    engine.writer.flush()
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["status"] == "running"
    assert "metrics" in written["windows"][0], "analysed before the window-end report was written"
    engine.close()


def test_window_analyses_on_a_node_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one rank's analysis holds the node lock, another rank's waits for it: one analysis process per
    node at a time (each needs 2-3x its trace's JSON size in memory)."""
    import threading

    from perfhooks.capture import window_job
    from perfhooks.capture.window_job import analyze_window, node_lock
    from perfhooks.rules.thresholds import Thresholds

    monkeypatch.setattr(window_job, "IN_PROCESS_MAX_BYTES", 0)  # a large trace's path: a child process

    trace = Path(__file__).parent / "data" / "traces" / "hta" / "mi250_minitoy_train.json.gz"
    finished = threading.Event()

    def analyse() -> None:
        analyze_window(trace, Thresholds(), first_step=1)
        finished.set()

    with node_lock(5.0) as held:  # another rank's analysis is running
        assert held
        worker = threading.Thread(target=analyse)
        worker.start()
        assert not finished.wait(3.0), "the analysis ran while the node's lock was held"
    assert finished.wait(60.0), "the analysis ran once the lock was free"
    worker.join()


def test_the_node_lock_is_the_users_and_its_wait_is_bounded(tmp_path: Path) -> None:
    """The lock file is this user's (mode 0600, the uid in its name): another user's runs neither block this one
    nor leave a file it cannot open. A wait past its bound gives up, and the analysis runs anyway."""
    import os
    import stat
    import tempfile

    from perfhooks.capture.window_job import LOCK_FILE, node_lock

    path = Path(tempfile.gettempdir()) / LOCK_FILE.format(uid=os.getuid())
    with node_lock(1.0) as first:
        assert first and stat.S_IMODE(path.stat().st_mode) == 0o600 and str(os.getuid()) in path.name
        with node_lock(0.3) as second:  # before, this waited with no bound
            assert second is False
    with node_lock(0.3) as again:
        assert again


def test_a_small_window_is_analysed_in_process_as_the_child_would() -> None:
    """In the training process (a few ms) or in a niced child (a large trace): the same metrics and verdicts."""
    import shutil
    import sys

    from perfhooks.capture import window_job
    from perfhooks.rules.thresholds import Thresholds

    trace = Path(__file__).parent / "data" / "traces" / "hta" / "mi250_minitoy_train.json.gz"
    assert trace.stat().st_size <= window_job.IN_PROCESS_MAX_BYTES
    here = window_job.analyze_window(trace, Thresholds(), first_step=1)
    command = window_job.analysis_command(trace, Thresholds())
    # the child runs at a lower CPU priority, beside training rather than in its way: idle from its exec where chrt is
    if sys.platform.startswith("linux") and shutil.which("chrt"):
        assert Path(command[0]).name == "chrt" and command[1:3] == ["--idle", "0"]
    elif shutil.which("nice"):
        assert Path(command[0]).name == "nice" and command[1:3] == ["-n", str(window_job.CHILD_NICENESS)]
    original = window_job.IN_PROCESS_MAX_BYTES
    window_job.IN_PROCESS_MAX_BYTES = 0
    try:
        child = window_job.analyze_window(trace, Thresholds(), first_step=1)
    finally:
        window_job.IN_PROCESS_MAX_BYTES = original
    assert here == child


@pytest.mark.parametrize(("level", "usdt_lines"), [(None, 2), ("5", 2), ("6", 0)])
def test_kineto_prints_its_usdt_lines_unless_its_log_level_is_6(level: str | None, usdt_lines: int) -> None:
    """Issue 29, item 18 (docs, Known limits): each window's two `USDT: ... profiler_start/stop` lines are Kineto's
    highest log level; only KINETO_LOG_LEVEL=6, which silences all of Kineto's own messages, hides them. A print of
    the program's own still shows."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    if level is not None:
        env["KINETO_LOG_LEVEL"] = level
    code = ("import sys, torch\nfrom torch.profiler import profile\nwith profile():\n    torch.ones(3) + 1\n"
            "print('mine', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    assert sum(line.startswith("USDT:") for line in done.stderr.splitlines()) == usdt_lines
    assert "mine" in done.stderr


def test_a_window_says_the_rss_it_added_and_stops_early_past_its_bound(tmp_path: Path) -> None:
    """Issue 75: a CPU accelerate job's window added 505 MB of peak RSS, unsaid. Each window's record now gives the
    RSS before it and the most it added; a window whose process grows past its bound (the larger of the setting and
    a quarter of the RSS before it) stops at that step, saved, says why, and its cycle opens no other window."""
    from perfhooks.capture.heap import rss_bytes

    engine = engine_for(tmp_path, schedule=Schedule(skip_first=1, warmup=1, active=2, repeat=1))
    plain_loop(engine, steps=5)
    engine.close()
    (window,) = engine.final_report["windows"]
    assert window["rss_before_bytes"] > 0 and window["peak_rss_added_bytes"] >= 0 and "stopped_early" not in window

    kept: list[bytearray] = []
    chunk = max(64 * 2**20, (rss_bytes() or 0) // 2)  # past a quarter of the RSS in one step, and past 1 MiB

    def grow(step: int) -> None:
        if 2 <= step <= 4:  # the window's steps: the process grows by a chunk a step (pages touched)
            kept.append(bytearray(b"x" * chunk))

    engine = engine_for(tmp_path / "bounded", schedule=Schedule(skip_first=1, warmup=1, active=4, repeat=1),
                        window_rss_limit_bytes=2**20)
    plain_loop(engine, steps=8, before_step=grow)
    engine.close()
    kept.clear()
    (window,) = engine.final_report["windows"]
    assert window["stopped_early"].startswith("stopped at step ") and "past the window's" in window["stopped_early"]
    assert window["peak_rss_added_bytes"] >= chunk
    assert window["last_step"] < 5  # the window was to record steps 2 to 5
    assert len(list((tmp_path / "bounded" / "traces").glob("*.gz"))) == 1
    cost = engine.final_report["overhead"]["windows"]
    assert cost["count"] == 1 and cost["stopped_early"] == 1 and cost["peak_rss_added_bytes"] >= chunk


@pytest.mark.parametrize(("accumulate", "recorded", "stopped"), [(1, 3, False), (3, 3, False), (4, 2, True),
                                                                 (8, 1, True)])
def test_a_window_records_at_most_its_bound_of_micro_batches(tmp_path: Path, accumulate: int, recorded: int,
                                                            stopped: bool) -> None:
    """Issue 75: a job that accumulates gradients over 8 micro-batches recorded 24 in a default window, at +30% a
    step and +400 MB of peak RSS on the CPU. A window stops, saved, after the recorded step that brings it to 8
    micro-batches (``window_micro_batches``), and says what it gave up; one step is always recorded, and the step
    that passes the bound is the window's last."""
    engine = engine_for(tmp_path, schedule=Schedule(skip_first=2, warmup=1, active=3, repeat=1))
    plain_loop(engine, steps=9, accumulate=accumulate)
    report = engine.close()
    (window,) = report["windows"]
    assert (window["first_step"], window["last_step"]) == (3, 3 + recorded - 1)
    trace = load_trace(Path(window["path"]))
    labels = sorted(n for n in annotation_names(trace) if n.startswith("ProfilerStep#"))
    assert labels == [f"ProfilerStep#{step}" for step in range(3, 3 + recorded)]
    assert annotation_names(trace).count("forward") == recorded * accumulate
    if stopped:
        assert window["stopped_early"] == (f"stopped at step {3 + recorded}: it recorded {recorded * accumulate} "
                                           f"micro-batches (steps 3 to {3 + recorded - 1}), the window's bound of 8")
        assert report["overhead"]["windows"]["stopped_early"] == 1
    else:
        assert "stopped_early" not in window
    assert len(list((tmp_path / "traces").glob("*.gz"))) == 1


def test_a_window_past_its_memory_bound_stops_inside_the_step_at_that_micro_batch(tmp_path: Path) -> None:
    """Issue 85: a one-step window over 8 micro-batches added 340 MB against a bound of 157, checked only at step
    ends. The bound is checked at each micro-batch's forward while a window records: the window stops at the
    micro-batch that crosses it, its record says which part of the step the trace holds, and the analysis weighs
    that step by the micro-batches recorded."""
    from perfhooks.capture.heap import rss_bytes

    kept: list[bytearray] = []
    chunk = max(64 * 2**20, (rss_bytes() or 0) // 2)  # past a quarter of the RSS in one micro-batch

    def grow(step: int) -> None:
        if step == 3 and len(kept) < 8:
            kept.append(bytearray(b"x" * (chunk if len(kept) == 2 else 2**20)))  # the third micro-batch grows

    engine = engine_for(tmp_path, schedule=Schedule(skip_first=2, warmup=1, active=1, repeat=1),
                        window_rss_limit_bytes=2**20)
    plain_loop(engine, steps=6, accumulate=8, in_forward=grow)
    report = engine.close()
    kept.clear()
    (window,) = report["windows"]
    assert (window["first_step"], window["last_step"]) == (3, 3)
    assert window["partial_step"] == {"step": 3, "recorded_micro_batches": 3, "micro_batches": 8}
    assert window["stopped_early"].startswith("stopped inside step 3, at its micro-batch 4: the process's RSS grew")
    trace = load_trace(Path(window["path"]))
    assert annotation_names(trace).count("forward") == 3  # the trace ends at the micro-batch that crossed
    assert [n for n in annotation_names(trace) if n.startswith("ProfilerStep#")] == ["ProfilerStep#3"]
    assert report["overhead"]["windows"]["stopped_early"] == 1
    assert report["steps"] == 6  # the run goes on: every step is counted
    from perfhooks.analysis.trace import load_trace as load
    from perfhooks.offline.analyze import analyze_trace

    whole = analyze_trace(load(Path(window["path"])))["metrics"]
    weighed = analyze_trace(load(Path(window["path"])), last_step_share=3 / 8)["metrics"]
    assert weighed["steps"] == pytest.approx(3 / 8)
    assert weighed["step_us"] == pytest.approx(whole["step_us"] * 8 / 3)  # a whole step's time, from 3 of its 8
