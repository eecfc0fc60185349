"""``perfhooks analyze``: text, JSON and HTML output, folders of ranks, exit codes."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from perfhooks.cli import main
from perfhooks.report.schema import validate_report

TRACES = Path(__file__).resolve().parent / "data" / "traces"
RESNET_0 = TRACES / "tb_plugin" / "resnet50_num_workers_0.worker0.1623143089861.pt.trace.json.gz"


def test_text_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(RESNET_0)]) == 0
    out = capsys.readouterr().out
    assert "GPU utilization 55.5%, est. SM efficiency 54.7%, est. achieved occupancy 49.1%" in out
    assert "[critical] dataloader_bound" in out and "fix: " in out


def test_json_follows_the_report_schema(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    assert main(["analyze", str(RESNET_0), "--format", "json", "--output", str(target)]) == 0
    report = json.loads(target.read_text())
    assert validate_report(report) == []
    metrics = report["metrics"]
    assert 0 <= metrics["gpu_utilization"] <= 1 and 0 <= metrics["sm_efficiency"] <= 1
    assert 1 < metrics["achieved_occupancy"] <= 100, "percent"
    assert set(metrics["breakdown"]) == {"kernel", "memcpy", "memset", "communication", "runtime", "dataloader",
                                         "cpu_exec", "other"}


def test_html_is_self_contained(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    assert main(["analyze", str(RESNET_0), "--format", "html", "-o", str(target)]) == 0
    page = target.read_text()
    assert 'id="diagnoses"' in page and "dataloader_bound" in page and "<svg" in page
    assert "<script" not in page and "<link" not in page
    assert not re.search(r'src="https?:', page), "nothing is fetched when the page opens"


def make_rank_trace(out: Path, rank: int, step_sleep_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers import plain_loop
    from perfhooks import Engine, PerfConfig, Schedule

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    engine = Engine(PerfConfig(schedule=Schedule(skip_first=1, warmup=1, active=3), console=False,
                               on_demand=False, analyze_windows=False), out, "test")
    plain_loop(engine, steps=6, in_forward=lambda step: time.sleep(step_sleep_s))
    engine.close()


def test_a_folder_of_ranks_is_one_run_with_a_straggler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    make_rank_trace(tmp_path, 0, 0.0, monkeypatch)
    make_rank_trace(tmp_path, 1, 0.2, monkeypatch)  # 200 ms a step: 10x what rank 0's steps take, even loaded
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["rank0.step2.pt.trace.json.gz",
                                                                        "rank1.step2.pt.trace.json.gz"]
    assert main(["analyze", str(tmp_path / "traces"), "--format", "json", "--workers", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ranks"]["count"] == 2
    step_ms = report["ranks"]["step_ms"]
    assert step_ms["1"] > step_ms["0"], "rank 1 is the slow one"
    assert report["ranks"]["source"] == "traces" and report["ranks"]["missing"] == []
    straggler = next(d for d in report["diagnoses"] if d["id"] == "straggler")
    assert straggler["measured"]["slowest_rank"] == 1


def test_report_phase_statistics_come_from_perfhooks_labels(tmp_path: Path, monkeypatch, capsys) -> None:
    make_rank_trace(tmp_path, 0, 0.0, monkeypatch)
    trace = next((tmp_path / "traces").iterdir())
    assert main(["analyze", str(trace), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 3
    assert report["phases"]["forward"]["mean_ms"] > 0 and report["phases"]["backward"]["mean_ms"] > 0
    # coverage is the four phases over the step, from the same labels (a loaded machine moves both: 0.48 under
    # two busy cores, so no bound on its value)
    phases = sum(report["phases"][name]["mean_ms"] for name in ("data_wait", "forward", "backward", "optimizer"))
    assert report["coverage"] == pytest.approx(phases / report["step_ms"]["mean"], rel=0.01)


def test_missing_path_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", os.devnull + "-absent"]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_html_draws_phase_series_from_perfhooks_labels(tmp_path: Path, monkeypatch) -> None:
    make_rank_trace(tmp_path, 0, 0.0, monkeypatch)
    trace = next((tmp_path / "traces").iterdir())
    target = tmp_path / "page.html"
    assert main(["analyze", str(trace), "--format", "html", "-o", str(target)]) == 0
    page = target.read_text()
    assert page.count("<polyline") == 5, "data_wait, forward, backward, optimizer and other per step"


def test_thresholds_change_the_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    nccl = str(TRACES / "hta" / "a100_nccl_rank0_of2.json.gz")  # GPU 23% busy
    assert main(["analyze", nccl, "--format", "json"]) == 0
    assert "low_gpu_utilization" in [d["id"] for d in json.loads(capsys.readouterr().out)["diagnoses"]]
    assert main(["analyze", nccl, "--format", "json", "--thresholds", '{"gpu_utilization": 0}']) == 0
    assert "low_gpu_utilization" not in [d["id"] for d in json.loads(capsys.readouterr().out)["diagnoses"]]
    assert main(["analyze", nccl, "--thresholds", '{"gpu_utilisation": 0.5}']) == 2
    assert "--thresholds" in capsys.readouterr().err


def test_a_run_writes_report_html_and_perfhooks_report_regenerates_it(tmp_path: Path, monkeypatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    make_rank_trace(tmp_path, 0, 0.0, monkeypatch)  # a real engine run, rank 0 of 2: report.rank0.json
    html = tmp_path / "report.rank0.html"
    page = html.read_text()
    assert 'id="diagnoses"' in page and "<svg" in page and "<script" not in page
    assert page.count('<polyline fill="none" stroke="#') - page.count('stroke="#2c3e50"') == 5, \
        "per-phase series of the run (the memory line aside)"
    html.unlink()
    assert main(["report", str(tmp_path)]) == 0
    assert html.exists() and str(html) in capsys.readouterr().out


def test_perfhooks_report_on_a_folder_without_reports_exits_2(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "no report.json found" in capsys.readouterr().err


def test_perfhooks_report_on_a_json_that_is_no_report_exits_2(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "report.json").write_text('{"steps": 3}')
    assert main(["report", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "not a perfhooks report" in error and "missing key 'schema_version'" in error
    assert not (tmp_path / "report.html").exists()


def test_two_traces_of_one_rank_are_an_error_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from fixtures import NUM_WORKERS_4, path

    for name in NUM_WORKERS_4:
        shutil.copy(path(name), tmp_path / name)
    assert main(["analyze", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "are both rank 0" in error
    assert all(name in error for name in NUM_WORKERS_4)


def test_other_json_in_a_folder_is_skipped_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from fixtures import path

    shutil.copy(path("v100_ns_resolution.pt.trace.json.gz"), tmp_path)
    assert main(["analyze", str(tmp_path), "--format", "json", "-o", str(tmp_path / "previous.json")]) == 0
    assert main(["analyze", str(tmp_path), "--format", "json"]) == 0  # the previous output is in the folder now
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 5
    assert report["warnings"] == [f"skipped: {tmp_path / 'previous.json'}: not a trace (no traceEvents list)"]


def test_a_file_gzipped_twice_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    from fixtures import path

    twice = tmp_path / "twice.json.gz"
    twice.write_bytes(gzip.compress(path("mi250_minitoy_train.json.gz").read_bytes()))
    assert main(["analyze", str(twice)]) == 2
    assert "compressed twice" in capsys.readouterr().err


def test_analyze_html_numbers_the_steps_as_the_trace_does(tmp_path: Path, monkeypatch) -> None:
    """Issue 29, item 8: the x axis showed 0, 1, 2 for a window of ProfilerStep#2-#4."""
    make_rank_trace(tmp_path, 0, 0.0, monkeypatch)
    trace = next((tmp_path / "traces").iterdir())
    target = tmp_path / "page.html"
    assert main(["analyze", str(trace), "--format", "html", "-o", str(target)]) == 0
    page = target.read_text()
    x_labels = re.findall(r'text-anchor="(?:middle|end)" font-size="11" fill="#555">(\d+)</text>', page)
    assert x_labels[:3] == ["2", "3", "4"]
    assert "step 2: " in page and "step 0: " not in page


def test_a_runs_own_window_analysis_runs_on_idle_cpu(tmp_path: Path) -> None:
    """The child that analyses a large window asks for SCHED_IDLE (it runs when a CPU would idle, not in the steps'
    way); ``perfhooks analyze --idle`` gives the same result as without."""
    import subprocess

    from perfhooks.capture.window_job import analysis_command
    from perfhooks.rules.thresholds import Thresholds

    command = analysis_command(RESNET_0, Thresholds())
    assert "--idle" in command
    probe = ("import os; from perfhooks.cli.main import _on_idle_cpu; _on_idle_cpu(); "
             "print(getattr(os, 'SCHED_IDLE', None) in (None, os.sched_getscheduler(0)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
    idle = subprocess.run([sys.executable, "-m", "perfhooks", "analyze", str(RESNET_0), "--format", "json", "--idle"],
                          capture_output=True, text=True, check=True)
    plain = subprocess.run([sys.executable, "-m", "perfhooks", "analyze", str(RESNET_0), "--format", "json"],
                           capture_output=True, text=True, check=True)
    with_idle, without = json.loads(idle.stdout), json.loads(plain.stdout)
    with_idle.pop("updated_at"), without.pop("updated_at")
    assert with_idle == without
