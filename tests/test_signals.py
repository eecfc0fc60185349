"""A run that a signal ends still tells its story: the report is saved as ``terminated`` with the signal's name
and the steps so far, then the handler that was there runs (or the default action), so the exit status is the
script's own. Each script runs as a user runs it, with the framework's defaults on, in a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "terminated.py"
#: The step at which the test sends its signal (the script prints ``step N`` after each optimizer step).
SIGNAL_AT = 40


def _run(framework: str, perf: bool, out: Path, send: signal.Signals = signal.SIGTERM, after_s: float | None = None,
         extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[int, int, str, int]:
    """Run the script; signal it at step ``SIGNAL_AT`` (or ``after_s`` seconds after its first step). The exit
    status, the last step it printed, its output, and the last step it had printed a second before the signal (a
    signal's report may miss the last second of steps, not more)."""
    process = subprocess.Popen([sys.executable, str(SCRIPT), framework, "1" if perf else "0", str(out), *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "WANDB_MODE": "disabled", **(env or {})})
    printed, lines, first, seen = 0, [], None, []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if line.startswith("step "):
            printed = int(line.split()[1])
            now = time.monotonic()
            seen.append((now, printed))
            first = first or now
            due = printed >= SIGNAL_AT if after_s is None else now - first >= after_s
            if due:
                process.send_signal(send)
                break
    sent = time.monotonic()
    rest, err = _rest_of(process)
    lines += rest.splitlines(keepends=True)
    printed = max([printed, *(int(x.split()[1]) for x in rest.splitlines() if x.startswith("step "))])
    second_before = max([0, *(step for when, step in seen if when <= sent - 1.0)])
    return process.returncode, printed, "".join(lines) + err, second_before


def _rest_of(process: subprocess.Popen) -> tuple[str, str]:
    """What the process writes until it ends, from where the line iteration stopped: its text buffer included
    (``communicate`` reads the pipe's descriptor and would lose the lines that buffer holds already, which a busy
    machine's child had written several of before the signal landed)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        out, err = pool.submit(process.stdout.read), pool.submit(process.stderr.read)  # type: ignore[union-attr]
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        return out.result(), err.result()


def _report(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "folder"),
                         [("plain", "."), ("hf", "_perfhooks"), ("accelerate", "perfhooks_out")])
def test_sigterm_saves_a_terminated_report_and_the_default_action_ends_the_process(
        tmp_path: Path, framework: str, folder: str) -> None:
    status, printed, output, second_before = _run(framework, True, tmp_path)
    assert status == -signal.SIGTERM, output[-3000:]  # as without perfhooks: no handler, the default action
    report = _report(tmp_path / folder)
    assert (report["status"], report["signal"]) == ("terminated", "SIGTERM")
    # a step may end between its optimizer step and the line the script prints after it: one more than printed
    assert second_before <= report["steps"] <= printed + 1, (report["steps"], second_before, printed)
    assert [w["first_step"] for w in report["windows"]] == [6], "the scheduled window was saved before"


@pytest.mark.slow
def test_sigterm_with_the_users_handler_runs_it_and_keeps_its_exit_status(tmp_path: Path) -> None:
    plain_status, _, plain_output, _ = _run("plain", False, tmp_path / "plain", extra=("--user-handler",))
    status, printed, output, second_before = _run("plain", True, tmp_path / "perf", extra=("--user-handler",))
    assert plain_status == status == 7, output[-3000:]
    assert "user handler" in plain_output and "user handler" in output
    report = _report(tmp_path / "perf")
    assert (report["status"], report["signal"]) == ("terminated", "SIGTERM")
    # a step may end between its optimizer step and the line the script prints after it: one more than printed
    assert second_before <= report["steps"] <= printed + 1, (report["steps"], second_before, printed)


@pytest.mark.slow
def test_a_sigterm_the_program_survives_leaves_a_completed_report(tmp_path: Path) -> None:
    """The program's own handler only notes the signal, and training runs to its end: the run completed, and its
    report names the signal survived, not ``terminated``."""
    plain_status, plain_printed, _, _ = _run("plain", False, tmp_path / "plain", extra=("--survive",))
    status, printed, output, _ = _run("plain", True, tmp_path / "perf", extra=("--survive",))
    assert plain_status == status == 0, output[-3000:]
    assert plain_printed == printed == 60 and "user handler" in output
    report = _report(tmp_path / "perf")
    assert (report["status"], report["survived_signal"], report["steps"]) == ("completed", "SIGTERM", 60)
    assert "signal" not in report


@pytest.mark.slow
def test_lightning_handles_its_sigterm_as_without_perfhooks(tmp_path: Path) -> None:
    """Lightning's own handler still runs (``received_sigterm``), stops the fit at its next step and exits as it
    would; the run's close rewrites the report with every step, still ``terminated``."""
    plain_status, _, plain_output, _ = _run("lightning", False, tmp_path / "plain")
    status, printed, output, _ = _run("lightning", True, tmp_path / "perf")
    assert status == plain_status, output[-3000:]
    assert "received_sigterm=True" in plain_output and "received_sigterm=True" in output
    report = _report(tmp_path / "perf" / "perf")
    assert (report["status"], report["signal"]) == ("terminated", "SIGTERM")
    assert report["steps"] >= 0.9 * printed
    assert (tmp_path / "perf" / "lightning_logs").exists(), "the logger wrote as usual"


@pytest.mark.slow
def test_sigkill_leaves_the_last_periodic_report(tmp_path: Path) -> None:
    status, printed, _, _ = _run("plain", True, tmp_path, send=signal.SIGKILL, after_s=8.0,
                              env={"PERFHOOKS_REPORT_EVERY_S": "1"})
    assert status == -signal.SIGKILL
    report = _report(tmp_path)
    assert report["status"] == "running" and report["updated_at"] > report["started_at"]
    assert report["steps"] >= 0.75 * printed, (report["steps"], printed)


def test_a_report_the_writer_is_writing_when_the_signal_comes_never_replaces_the_signals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A periodic report reads the file on disk (a ``running`` report never replaces a ``terminated`` one), then
    writes. Under load the signal's report landed between the two, and the periodic one replaced it: a SIGTERM-ed
    run read without its ``signal``. Here the writer is held right between them while the signal's report is
    written from the helper's thread: it waits for the writer's write, then stands; the close still writes the
    full report."""
    import threading

    import perfhooks
    from perfhooks.report import write
    from perfhooks.runtime.ending import lifecycle

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    perf = perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, wandb=False, schedule=None)
    for _ in range(5):
        with perf.data_wait():
            x = torch.randn(2, 4)
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    engine = perf.engine
    between, go_on = threading.Event(), threading.Event()
    write_files = write._write_json_and_html

    def held_between_read_and_write(path: Path, report: dict[str, Any], render: Any) -> None:
        if report["status"] == "running" and threading.current_thread().name != "MainThread":
            between.set()
            go_on.wait(30)
        write_files(path, report, render)

    monkeypatch.setattr(write, "_write_json_and_html", held_between_read_and_write)
    engine.saving.save(window=False)  # a periodic report of the state before the signal
    assert between.wait(30)
    helper_done = threading.Event()

    def helper(job: Any, wait_s: float) -> bool:
        threading.Thread(target=lambda: (job(), helper_done.set()), name="helper").start()
        return True

    lifecycle.terminate(engine, "SIGTERM", busy=False, helper=helper)
    helper_done.wait(2)  # unordered, the signal's report is written by now; in turn, it waits for the writer's
    go_on.set()
    assert helper_done.wait(30) and engine.writer.flush(30)
    report = _report(tmp_path)
    assert (report["status"], report.get("signal")) == ("terminated", "SIGTERM"), "the periodic report replaced it"
    perf.close()
    assert _report(tmp_path)["steps"] == 5  # the close writes the full report over it
