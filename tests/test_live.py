"""The live view: each rank's live file, the live line, and stalls named as they happen (the rank, the phase, the
seconds, the training thread's stack, the device's queue), read by ``perfhooks top``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from perfhooks.cli.main import main
from perfhooks.cli.top import read_frame, render, summary
from perfhooks.report.statistics import PhaseStatistics, StepTiming
from perfhooks.rules.stalls import diagnose_stalls
from perfhooks.runtime.state.live_watch import LiveWatch
from perfhooks.runtime.state.run_state import ReportParts, RunState

SCRIPTS = Path(__file__).parent / "scripts"


def _state(steps: int, step_ms: float = 100.0, status: str = "running") -> RunState:
    stats = PhaseStatistics()
    for n in range(steps):
        stats.add(StepTiming(n, step_ms, {"data_wait": 10.0, "forward": 40.0, "backward": 50.0}, 1, samples=8))
    return RunState(steps, steps, status, None, None, float(steps), stats.snapshot(), ReportParts())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch(tmp_path: Path, phase_now: list[Any], clock: Clock, stall_after_s: float | None = None,
           console_every_s: float = 0.0, state: RunState | None = None) -> tuple[LiveWatch, list[int]]:
    saved: list[int] = []
    from perfhooks.faults import FaultLog

    watch = LiveWatch(rank=0, world_size=1, output_dir=tmp_path, stall_after_s=stall_after_s,
                      console_every_s=console_every_s, state=lambda: state or _state(30),
                      phase_now=lambda: tuple(phase_now), device=lambda: "none", on_stall=lambda: saved.append(1),
                      faults=FaultLog(), clock=clock)
    return watch, saved


def test_a_phase_longer_than_the_bound_is_a_stall_with_the_stack_and_its_length_when_it_ends(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    phase_now: list[Any] = ["data_wait", clock.now, 30]
    watch, saved = _watch(tmp_path, phase_now, clock, stall_after_s=3.0)
    clock.now += 2.9
    watch.tick()
    assert watch.records() == [] and saved == []
    clock.now += 0.2  # 3.1 s in data_wait
    watch.tick()
    (stall,) = watch.records()
    assert (stall["rank"], stall["step"], stall["phase"], stall["seconds"], stall["ended"]) == (0, 30, "data_wait",
                                                                                                  3.1, False)
    assert stall["device"] == "none" and any("test_live.py" in line for line in stall["stack"])
    assert "thread" in Path(stall["threads_file"]).read_text()  # every thread's stack, beside the report
    said = capsys.readouterr().err
    assert said.startswith("perfhooks: rank 0 stalled in data_wait for 3 s at step 30: ") and saved == [1]
    live = json.loads((tmp_path / "live.rank0.json").read_text())
    assert live["stalled"] and live["phase"] == "data_wait" and live["stalls"][0]["seconds"] == 3.1
    clock.now += 7.0
    watch.tick()
    assert watch.records()[0]["seconds"] == 10.1 and not watch.records()[0]["ended"]
    phase_now[:] = ["forward", clock.now + 0.5, 30]  # the fetch returned half a second ago... as the phase_now says
    watch.tick()
    assert watch.records()[0] | {} == {**stall, "seconds": 10.6, "ended": True}
    assert not json.loads((tmp_path / "live.rank0.json").read_text())["stalled"] and saved == [1, 1]


def test_the_default_bound_is_120_s_or_20_p95_steps(tmp_path: Path) -> None:
    clock = Clock()
    watch, _ = _watch(tmp_path, ["forward", clock.now, 30], clock)
    assert watch.stall_limit(_state(30, step_ms=100.0)) == 120.0
    assert watch.stall_limit(_state(31, step_ms=9000.0)) == pytest.approx(180.0)  # 20 x 9 s


def test_the_live_line_every_console_every_s_on_rank_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    watch, _ = _watch(tmp_path, ["forward", clock.now, 30], clock, stall_after_s=1e6, console_every_s=300.0)
    watch.tick()
    assert capsys.readouterr().err == ""
    clock.now += 300.0
    watch.tick()
    line = capsys.readouterr().err.strip()
    assert line.startswith("perfhooks: step 30; step p50 100.0 ms; data_wait 10% forward 40% backward 50%")
    assert "\n" not in line and "80.0 samples/s" in line


def test_stalled_names_the_rank_the_phase_and_the_line() -> None:
    (verdict,) = diagnose_stalls([{"rank": 1, "step": 20, "phase": "data_wait", "seconds": 125.0, "ended": False,
                                   "stack": ["/x/train.py:9 in main", "/x/dataset.py:42 in __getitem__"],
                                   "device": "drained"}])
    assert verdict["id"] == "stalled" and verdict["severity"] == "critical"
    assert "rank 1 spent 125 s in data_wait at step 20" in verdict["evidence"]
    assert verdict["evidence"].endswith("at /x/dataset.py:42 in __getitem__")


def test_the_stuck_rank_is_the_one_waiting_for_its_own_loader_whatever_started_first() -> None:
    """DDP: rank 1 sleeps in its dataset; rank 0 reaches the gradient all-reduce and waits there. On a busy host
    rank 0's backward can begin a few ms before rank 1's data_wait (CI saw it): a data_wait stall is the rank's
    own, so rank 1 is the stuck one."""
    stalls = [{"rank": 0, "step": 7, "phase": "backward", "seconds": 14.0, "ended": True, "started_at": 100.000},
              {"rank": 1, "step": 7, "phase": "data_wait", "seconds": 15.0, "ended": True, "started_at": 100.004,
               "stack": ["/x/dataset.py:42 in __getitem__"]}]
    (verdict,) = diagnose_stalls(stalls)
    assert verdict["title"] == "Rank 1 stalled in data_wait" and "rank 0 waited in backward" in verdict["evidence"]
    # with no data_wait among them, the first to stall is the stuck one
    (verdict,) = diagnose_stalls([{**stalls[0], "phase": "optimizer"}, {**stalls[1], "phase": "backward"}])
    assert verdict["title"] == "Rank 0 stalled in optimizer"


def test_top_puts_the_stuck_rank_first_and_says_what_the_others_wait_in(tmp_path: Path) -> None:
    now = time.time()
    for rank in range(8):
        stalled = rank == 1
        live = {"rank": rank, "updated_at": now, "status": "running", "step": 20, "step_p50_ms": 36.0 + rank,
                "phase": "data_wait" if stalled else "backward", "in_phase_s": 12.0, "stalled": stalled,
                "stack": ["/x/dataset.py:42 in __getitem__"] if stalled else [], "shares": {"forward": 0.4},
                "stalls": [{"rank": rank, "phase": "data_wait", "seconds": 12.0, "ended": False}] if stalled else []}
        folder = tmp_path / f"node{rank // 4}"
        folder.mkdir(exist_ok=True)
        (folder / f"live.rank{rank}.json").write_text(json.dumps(live))
    frame = read_frame([str(tmp_path / "node0"), str(tmp_path / "node1")], now=now + 1.0)
    assert [r["rank"] for r in frame["ranks"]][:2] == [1, 7]  # the stuck rank, then the slowest
    assert frame["summary"] == "rank 1 stalled in data_wait (dataset.py:42 in __getitem__); ranks 0, 2-7 in backward"
    assert frame["stalls"][0]["rank"] == 1
    assert (frame["ranks"][0]["in_phase_s"], frame["ranks"][0]["age_s"]) == (12.0, 1.0), "as written; the age apart"
    render(frame)
    assert summary([]) == ""


def _live_files(folder: Path, ranks: int, status: str = "running", updated_at: float | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        live = {"rank": rank, "updated_at": updated_at or time.time(), "status": status, "step": 2120,
                "step_p50_ms": 212.3 + rank, "step_p95_ms": 260.1, "steps_per_s": 4.7, "samples_per_s": 150.2,
                "memory_bytes": 12 * 2**30, "phase": "data_wait" if rank == 1 else "backward", "in_phase_s": 0.02,
                "stalled": rank == 1, "stack": ["/x/dataset.py:42 in __getitem__"] if rank == 1 else [],
                "shares": {"data_wait": 0.3, "forward": 0.25, "backward": 0.35, "optimizer": 0.05, "other": 0.05},
                "verdicts": ["dataloader_bound", "low_gpu_utilization", "host_bound"], "stalls": []}
        (folder / f"live.rank{rank}.json").write_text(json.dumps(live))


def test_top_fits_80_columns_in_a_pipe_with_every_header_whole(tmp_path: Path) -> None:
    _live_files(tmp_path, 8)
    done = subprocess.run([sys.executable, "-m", "perfhooks", "top", "--once", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines, done.stderr
    assert max(len(line) for line in lines) <= 80, lines
    header = next(line for line in lines if "rank" in line and "step" in line)
    for name in ("rank", "step", "p50 ms", "phase", "in", "top phases", "verdicts"):
        assert f" {name} " in f" {header} ", (name, header)
    assert "bwd 35% data 30%" in done.stdout and "dataloader_bound +3" in done.stdout
    assert "…" not in done.stdout


def test_top_titles_a_finished_run_by_its_status_and_names_the_run_it_chose(tmp_path: Path) -> None:
    _live_files(tmp_path / "runs" / "old", 2, status="completed", updated_at=time.time() - 100)
    _live_files(tmp_path / "runs" / "new", 2, status="completed")
    frame = read_frame([str(tmp_path / "runs")])
    assert frame["summary"].startswith("run completed at step 2120")
    assert frame["run"].endswith("new") and frame["other_runs"][0].endswith("old")
    assert "the newest of 2 runs found" in frame["summary"]


def test_top_with_no_live_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--once", str(tmp_path)]) == 2
    assert "no live.rank*.json found" in capsys.readouterr().err


def _stalling_loop(out: Path, sleep_s: float) -> subprocess.Popen[str]:
    """stalls_once.py, its stall bound 2 s, returned once its loader has started a ``sleep_s`` sleep at step 10."""
    process = subprocess.Popen([sys.executable, str(SCRIPTS / "stalls_once.py"), str(out), "10", str(sleep_s)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PERFHOOKS_STALL_AFTER_S": "2"})
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("sleeping"):
            break
    return process


@pytest.mark.slow
def test_a_real_loop_stalled_in_its_dataset_is_named_by_perfhooks_top_during_the_stall(tmp_path: Path) -> None:
    process = _stalling_loop(tmp_path, sleep_s=8)
    time.sleep(4.5)  # the watch looks every second: the stall (2 s) is in the live file by now
    done = subprocess.run([sys.executable, "-m", "perfhooks", "top", "--once", "--json", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    frame = json.loads(done.stdout)
    (rank,) = frame["ranks"]
    assert rank["stalled"] and rank["phase"] == "data_wait", rank
    assert any("__getitem__" in line for line in rank["stack"]), rank["stack"]
    assert re.search(r"perfhooks: rank 0 stalled in data_wait for \d+ s at step 10: stalls_once.py:\d+ in __getitem__",
                     err), err[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    (stall,) = report["stalls"]
    assert stall["ended"] and stall["seconds"] >= 7.0 and stall["phase"] == "data_wait"
    assert "stalled" in [d["id"] for d in report["diagnoses"]]


@pytest.mark.slow
def test_a_stall_sends_a_wandb_alert_and_ends_in_the_report(tmp_path: Path, offline_wandb: Path) -> None:
    """Real wandb offline: a phase held 2.5 s past a 1 s bound is a stall, a W&B alert names it, and the run's
    report and verdicts keep it with its length."""
    import wandb

    from perfhooks import Engine, PerfConfig
    from wandb_records import wandb_records

    run = wandb.init(project="perfhooks-tests")  # the user's run, opened before training
    engine = Engine(PerfConfig(schedule=None, console=False, wandb_log_every=1, stall_after_s=1.0),
                    tmp_path / "out", "test")
    for _ in range(3):
        engine.phase_start("forward")
        engine.step_end()
    engine.phase_start("data_wait")
    time.sleep(2.5)  # the watch looks every second: past the bound at its second or third look
    engine.phase_start("forward")
    engine.step_end()
    report = engine.close()
    run.finish()
    assert report is not None
    (stall,) = report["stalls"]
    assert stall["phase"] == "data_wait" and stall["ended"] and 2.0 <= stall["seconds"] < 10.0
    assert "stalled" in [d["id"] for d in report["diagnoses"]]
    alerts = [r["alert"] for r in wandb_records(offline_wandb) if r["type"] == "alert"]
    assert [a["title"] for a in alerts] == ["perfhooks: rank 0 stalled in data_wait"], alerts


@pytest.mark.slow
def test_a_run_killed_during_a_stall_ends_with_a_stalled_verdict(tmp_path: Path) -> None:
    """SIGTERM while the loader sleeps: the terminated report names the stall, its rank, phase and line."""
    import signal

    process = _stalling_loop(tmp_path, sleep_s=30)
    time.sleep(4.0)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["status"], report["signal"]) == ("terminated", "SIGTERM")
    verdict = next(d for d in report["diagnoses"] if d["id"] == "stalled")
    assert verdict["title"] == "Rank 0 stalled in data_wait" and verdict["evidence"].endswith("in __getitem__")


def test_the_live_file_ends_with_the_runs_last_step_and_status(tmp_path: Path) -> None:
    """The last frame is written at the close: ``perfhooks top`` (and ``perfhooks mcp``'s live status) read a run
    that ended as ended at its last step, not as running at the step of the last tick."""
    import torch

    import perfhooks

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, wandb=False, schedule=None) as perf:
        for _ in range(7):
            with perf.data_wait():
                x = torch.randn(2, 4)
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    live = json.loads((tmp_path / "live.rank0.json").read_text())
    assert (live["status"], live["step"]) == ("completed", 7)
    frame = read_frame([str(tmp_path)])
    assert [(rank["status"], rank["step"]) for rank in frame["ranks"]] == [("completed", 7)]
    # perfhooks' own share of the steps and the steps the phases come from, as the report says them
    report = json.loads((tmp_path / "report.json").read_text())
    assert live["phase_steps"] == report["phase_steps"] == 7
    assert 0 < live["overhead"] < 1 and 0 < report["overhead"]["share_of_run"] < 1
    table = render(frame, width=200)
    assert "perfhooks" in [column.header for column in table.columns]
    assert f"{live['overhead']:.1%}" in list(table.columns[[c.header for c in table.columns].index("perfhooks")].cells)
    html = (tmp_path / "report.html").read_text()
    assert 'id="overhead"' in html and "phases from 7 of 7 steps" in html


def test_a_windows_verdicts_reach_the_live_file_at_the_watchs_next_look(tmp_path: Path) -> None:
    """A window's analysis ends on the writer thread after the window-end publish: its verdicts are in the live file
    at the watch's next look (every second), and in the state published at the next step, not a minute later."""
    import torch

    import perfhooks

    class SlowData(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10_000

        def __getitem__(self, index: int) -> torch.Tensor:
            time.sleep(0.002)
            return torch.randn(32)

    loader = iter(torch.utils.data.DataLoader(SlowData(), batch_size=8))
    model = torch.nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    schedule = perfhooks.Schedule(skip_first=2, warmup=1, active=2, repeat=1)
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, schedule=schedule,
                           report_every_s=3600) as run:
        def step() -> None:
            with run.data_wait():
                batch = next(loader)
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

        for _ in range(8):
            step()
        engine = run.engine
        assert engine.writer.flush(60), "the window's export and analysis ran"
        analysed = [d["id"] for d in engine.saving.trace.diagnoses]
        assert "dataloader_bound" in analysed
        engine.watch.tick()  # the watch's next look
        live = json.loads((tmp_path / "live.rank0.json").read_text())
        assert live["verdicts"] == analysed
        step()
        assert [d["id"] for d in engine.state.parts.trace.diagnoses] == analysed, "published at the next step"
