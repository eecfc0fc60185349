"""Each failure mode a profiler must survive, proven on a real Lightning fit (README, "Reliability").

Faults are injected where they cannot be produced for real here: an exception inside perfhooks at
each event, a full disk. Everything else (OOM, Ctrl-C, torch.compile, nested profilers) is real.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import perfhooks
from helpers import lightning_mlp, quiet_trainer, random_loader, read_report
from perfhooks.faults import PerfhooksWarning

SCRIPTS = Path(__file__).resolve().parent / "scripts"
WINDOW = perfhooks.Schedule(skip_first=2, warmup=1, active=2)


def _fit(out: Path, steps: int = 10, model: Any = None, **settings: Any) -> Any:
    from perfhooks.integrations.lightning import PerfCallback

    callback = PerfCallback(output_dir=out, **{"console": False, "schedule": WINDOW, **settings})
    trainer = quiet_trainer(max_steps=steps, callbacks=[callback])
    trainer.fit(model if model is not None else lightning_mlp(), random_loader(steps))
    return trainer


def _perfhooks_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, PerfhooksWarning)]


def _assert_no_partial_files(out: Path) -> None:
    leftovers = [p for p in out.rglob("*") if p.name.endswith(".tmp") or (p.name.startswith(".") and p.is_file())]
    assert leftovers == []
    for trace in out.rglob("*.json.gz"):
        json.loads(gzip.decompress(trace.read_bytes()))  # every trace that is there is whole
    for report in out.rglob("report*.json"):
        json.loads(report.read_text())


# --------------------------------------------------------------------------- faults inside perfhooks
def _raise(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("injected fault")


#: (what is broken, the object and attribute replaced by a raising function, the fault kinds reported).
INJECTIONS = [
    ("timing", "perfhooks.device.clock.HostClock.elapsed_ms", {"step_end"}),
    ("annotation", "perfhooks.capture.labels.ProfilerLabels.enter", {"phase_start"}),
    ("window", "perfhooks.capture.windows.CaptureWindows.at_step", {"window"}),
    ("export", "torch.autograd.profiler.profile.export_chrome_trace", {"trace_export"}),
    ("analysis", "perfhooks.capture.window_job.analyze_in_process", {"window_analysis"}),
    ("memory", "perfhooks.memory.monitor.MemoryMonitor.sample", {"memory_sample", "memory_report"}),
    ("report", "perfhooks.runtime.ending.lifecycle.write_report", {"report_write"}),
    ("diagnoses", "perfhooks.runtime.state.reporting.diagnose_live", {"live_diagnoses"}),
    ("trigger", "perfhooks.capture.trigger.OnDemandTrigger.poll", {"trigger"}),
]


@pytest.mark.parametrize(("what", "target", "kinds"), INJECTIONS, ids=[i[0] for i in INJECTIONS])
def test_a_fault_at_each_place_warns_once_per_kind_and_training_completes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, target: str, kinds: set[str]) -> None:
    module, _, attribute = target.rpartition(".")
    owner: Any
    try:
        owner = __import__(module, fromlist=["_"])
    except ImportError:
        module, _, cls = module.rpartition(".")
        owner = getattr(__import__(module, fromlist=["_"]), cls)
    monkeypatch.setattr(owner, attribute, _raise)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, steps=10)
    assert trainer.global_step == 10  # training completed
    said = _perfhooks_warnings(caught)
    reported = {message.split()[1] for message in said if "failed and was skipped" in message}
    assert reported == kinds, said
    assert len([m for m in said if "failed and was skipped" in m]) == len(kinds)  # once per kind
    if what != "report":
        assert {f["kind"] for f in read_report(tmp_path)["faults"]} == kinds


# --------------------------------------------------------------------------- disk
class _DiskFullFile:
    """A file whose writes stop with ENOSPC after a few bytes, as on a full disk."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, data: bytes) -> int:
        self.raw.write(data[:16])
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __enter__(self) -> _DiskFullFile:
        return self

    def __exit__(self, *args: Any) -> None:
        self.raw.close()


class _DiskFullOs:
    """``os`` as perfhooks.files.atomic sees it on a full disk."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def fdopen(fd: int, mode: str = "r", *args: Any) -> _DiskFullFile:
        return _DiskFullFile(os.fdopen(fd, mode, *args))


def test_a_full_disk_warns_and_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import perfhooks.files.atomic

    monkeypatch.setattr(perfhooks.files.atomic, "os", _DiskFullOs())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, steps=10)
    assert trainer.global_step == 10
    said = _perfhooks_warnings(caught)
    assert any("No space left on device" in m for m in said), said
    assert not (tmp_path / "report.json").exists()
    assert not list((tmp_path / "traces").glob("*.gz"))
    _assert_no_partial_files(tmp_path)


def test_an_unwritable_output_folder_warns_and_training_completes(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the output folder should be")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(blocker / "perf", steps=8)
    assert trainer.global_step == 8
    assert _perfhooks_warnings(caught)


# --------------------------------------------------------------------------- leaks
def test_capture_cycles_do_not_leak_host_memory(tmp_path: Path) -> None:
    """After a warm-up (allocator arenas, Kineto's first sessions, and the run's window records filling up to
    their bound, MAX_WINDOW_RECORDS), RSS over 100 more capture cycles must not climb by more than 100 KB per cycle
    (least-squares slope)."""
    from perfhooks.capture.windows import MAX_WINDOW_RECORDS

    # 100 points: the heap grows and gives back in waves of about 30 cycles, so a slope over 20 read 33 to 101 KB a
    # cycle idle (2026-11-29, the same code), where over 100 it reads 15 to 24
    warmup, measured = MAX_WINDOW_RECORDS + 10, 100
    done = subprocess.run([sys.executable, str(SCRIPTS / "capture_cycles_rss.py"), str(tmp_path),
                           str(warmup + measured)], capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["windows"] == min(warmup + measured, MAX_WINDOW_RECORDS)
    rss = result["rss"][warmup:]
    xs = range(len(rss))
    mean_x, mean_y = sum(xs) / len(rss), sum(rss) / len(rss)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, rss, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs)
    assert slope <= 100 * 1024, f"RSS grows {slope / 1024:.1f} KB per capture cycle"
    assert len(list((tmp_path / "traces").glob("*.gz"))) <= 2  # max_traces


# --------------------------------------------------------------------------- torch.compile
def test_torch_compile_with_every_feature_on_has_no_graph_break(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.compile(lightning_mlp(), backend="eager")
    trainer = _fit(tmp_path, steps=8, model=model, module_ranges=True, memory=True, nvtx=True,
                   record_shapes=True, profile_memory=True, with_stack=True)
    assert trainer.global_step == 8
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile
    report = read_report(tmp_path)
    assert report["steps"] == 8 and report["windows"] and report["faults"] == []


# --------------------------------------------------------------------------- other profilers
def test_inside_a_users_torch_profiler_one_warning_and_no_crash(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.profiler.profile() as user_profiler:
            trainer = _fit(tmp_path, steps=8)
    assert trainer.global_step == 8
    assert user_profiler.events()  # the user's profile is intact
    said = _perfhooks_warnings(caught)
    assert len([m for m in said if "another torch.profiler session" in m]) == 1
    assert read_report(tmp_path)["windows"] == []


# --------------------------------------------------------------------------- interrupts and OOMs
def test_ctrl_c_in_the_middle_of_a_window(tmp_path: Path) -> None:
    """Lightning turns Ctrl-C into a graceful shutdown and exit status 1, with perfhooks as without it;
    the partial window is saved whole and the report says why the run stopped."""
    statuses = {}
    for perf in (False, True):
        out = tmp_path / f"perf{int(perf)}"
        done = subprocess.run([sys.executable, str(SCRIPTS / "interrupt_in_window.py"), str(int(perf)), str(out)],
                              capture_output=True, text=True, timeout=300)
        statuses[perf] = done.returncode
        assert "fit returned" not in done.stdout
    assert statuses[True] == statuses[False] == 1
    out = tmp_path / "perf1"
    _assert_no_partial_files(out)
    report = read_report(out)
    assert report["status"] == "failed" and report["error"]["type"] == "KeyboardInterrupt"
    assert [(w["first_step"], w["last_step"]) for w in report["windows"]] == [(3, 4)]


@pytest.mark.parametrize(("where", "phase"), [("forward", "forward"), ("backward", "backward"),
                                              ("optimizer", "optimizer"), ("data", "data_wait")])
def test_an_oom_anywhere_propagates_with_the_same_exit_status(tmp_path: Path, where: str, phase: str) -> None:
    """The program with perfhooks ends as it does without: exit 1 and torch's OOM as the last line. The program
    without perfhooks is run once (for the forward OOM): the same error ends it wherever it is raised."""
    results = {}
    for perf in (False, True) if where == "forward" else (True,):
        out = tmp_path / f"perf{int(perf)}"
        done = subprocess.run([sys.executable, str(SCRIPTS / "oom_anywhere.py"), where, str(int(perf)), str(out)],
                              capture_output=True, text=True, timeout=300)
        results[perf] = (done.returncode, done.stderr.strip().splitlines()[-1])
    assert results[True] == results.get(False, (1, OOM_LAST_LINE))
    assert results[True][0] == 1 and results[True][1] == OOM_LAST_LINE
    report = read_report(tmp_path / "perf1")
    assert report["error"]["type"] == "OutOfMemoryError" and report["error"]["phase"] == phase
    assert (tmp_path / "perf1" / "oom" / "summary.json").exists()


#: How the OOM of ``oom_anywhere.py`` ends the program without perfhooks: its last stderr line.
OOM_LAST_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                 "capacity of 79.11 GiB")


def test_a_close_that_runs_out_of_time_drops_the_late_jobs_instead_of_running_them_after(tmp_path: Path) -> None:
    """The writer is busy past the close's timeout: the jobs still queued never run (a late report write would
    land after the final report and replace it), and a writer used again starts clean."""
    import threading

    from perfhooks.faults import FaultLog
    from perfhooks.files.writer import BackgroundWriter

    writer = BackgroundWriter(FaultLog())
    release = threading.Event()
    ran: list[str] = []
    writer.submit("slow", lambda: release.wait(10.0) and ran.append("slow"))
    writer.submit("late report", lambda: ran.append("late report"))
    writer.close(timeout_s=0.2)  # the slow job holds the thread past the timeout
    release.set()
    deadline = time.monotonic() + 10.0
    while "slow" not in ran and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # time enough for the late job to run, were it still to run
    assert ran == ["slow"] and writer.dropped == 1
    writer.submit("next run", lambda: ran.append("next run"))
    assert writer.flush(10.0) and ran == ["slow", "next run"]
    writer.close()


def test_the_final_report_is_synced_to_disk_and_a_running_one_is_not(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A host OOM-kill or a power loss right after the close keeps the run's last word: its report is fsynced
    (file, then folder). Reports written while the run goes on are not (a sync a minute would cost for nothing)."""
    from perfhooks.report.write import write_report

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    report = {"rank": 0, "world_size": 1, "run_id": "r", "started_at": 1.0, "status": "running"}
    write_report(tmp_path, report)
    assert synced == []
    write_report(tmp_path, {**report, "status": "completed"})
    assert len(synced) == 2 and synced[1] == str(tmp_path), synced  # the temp file, then the folder
