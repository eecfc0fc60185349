"""``perfhooks doctor``: on this CPU machine (the device checks skip), and on the simulated GPU (they run)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
from simulated_gpu import simulated_cuda

from perfhooks.cli.doctor import doctor

DEVICE_CHECKS = ("device timing", "event cost", "memory stats", "memory history", "memory snapshot", "oom observer")
#: Skipped on the simulation too: it maps no CUDA runtime library (tested with a stand-in timer below).
DEVICE_CHECKS_CUDA_RUNTIME = ("reader timer",)


def _by_name(document: dict) -> dict[str, dict]:
    return {check["name"]: check for check in document["checks"]}


def test_on_this_cpu_machine_it_passes_and_skips_the_device_with_the_reason(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "perfhooks", "doctor", "--format", "json", "-o",
                           str(tmp_path / "doctor.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert json.loads((tmp_path / "doctor.json").read_text()) == document
    assert len(document["checks"]) >= 10
    assert all(set(check) == {"name", "status", "detail", "figure"} for check in document["checks"])
    checks = _by_name(document)
    for name in DEVICE_CHECKS + DEVICE_CHECKS_CUDA_RUNTIME:
        assert checks[name]["status"] == "skip" and "torch.cuda.is_available() is False" in checks[name]["detail"]
    for framework in ("lightning", "transformers", "accelerate", "torch"):
        check = checks[f"version: {framework}"]
        assert check["status"] == "pass" and check["figure"]["version"] == metadata.version(framework)
        assert "tested" in check["detail"] and len(check["figure"]["tested"]) == 2
    assert checks["profiler"]["status"] == "pass" and document["summary"]["fail"] == 0


def test_on_the_simulated_gpu_every_device_check_runs_and_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The events read the kernel's own 50 ms (its cycles at the peak clock), plus the host's gap between
    recording the start event on the idle stream and launching the kernel: the device runs the start at once and
    the kernel when it arrives, on a real GPU as here, so a preempted host widens the interval by its delay. Each
    trial's gap is taken from the simulation's own timeline: where the kernel began on the stream, less where the
    start event completed."""
    from perfhooks.cli import doctor_checks
    from perfhooks.device.room import DeviceRoom

    completions: list[float] = []
    trials: list[tuple[float, float, float]] = []  # (event ms, host ms, the launch gap in ms)
    record, kernel = DeviceRoom.record, doctor_checks._kernel

    def recorded(room: DeviceRoom, event: Any) -> None:
        record(room, event)
        completions.append(event._completes_at)

    def timed_kernel(room: Any, sleep: Any, cycles: int) -> tuple[float, float]:
        launched: list[float] = []

        def launch(cycles: int) -> None:
            sleep(cycles)
            # where the kernel began on the simulated stream (it ends the stream's work; s on perf_counter)
            launched.append(room.stream().busy_until - cycles / gpu.cycles_per_ms / 1e3)

        completions.clear()
        event_ms, host_ms = kernel(room, launch, cycles)
        trials.append((event_ms, host_ms, (launched[0] - completions[-2]) * 1e3))  # the start, then the end
        return event_ms, host_ms

    monkeypatch.setattr(DeviceRoom, "record", recorded)
    monkeypatch.setattr(doctor_checks, "_kernel", timed_kernel)
    with simulated_cuda() as gpu:
        checks = _by_name(doctor("cuda:0"))
    for name in DEVICE_CHECKS:
        assert checks[name]["status"] == "pass", checks[name]
    timing = checks["device timing"]["figure"]
    # the trial the figure came from (two trials may round to the same figures: each then holds)
    matched = [trial for trial in trials if round(trial[1], 3) == timing["host_ms"]
               and round(trial[0], 3) == timing["event_ms"]]
    assert matched and timing["floor_ms"] == 50.0
    for event_ms, _, gap_ms in matched:
        assert event_ms - gap_ms == pytest.approx(50.0, abs=0.01)  # the peak clock's
    assert timing["host_ms"] >= 50.0  # the host sees the kernel done after it is, never before
    assert checks["cupti"]["status"] == "warn", "a CPU build of torch records no CUDA activity"
    assert checks["reader timer"]["status"] == "skip" and "no CUDA runtime library" in checks["reader timer"]["detail"]


@pytest.mark.parametrize(("skew_ms", "status"), [(0.0, "pass"), (5.0, "warn")])
def test_the_reader_timer_check_compares_the_timer_with_torch(skew_ms: float, status: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for the ctypes timer (the simulation's interval, read without a device call): agreeing with
    torch it passes; 5 ms off it warns, naming both figures."""
    from perfhooks.device.room import DeviceRoom

    def thread_timer(room: DeviceRoom) -> Any:
        return lambda start, end: start.raw_elapsed_ms(end) + skew_ms

    monkeypatch.setattr(DeviceRoom, "thread_timer", thread_timer)
    with simulated_cuda():
        check = _by_name(doctor("cuda:0"))["reader timer"]
    assert check["status"] == status, check
    assert abs(check["figure"]["timer_ms"] - check["figure"]["torch_ms"] - skew_ms) < 1e-3


@pytest.mark.parametrize(("cuda_version", "environ", "status", "detached"), [
    ("12.8", {}, "pass", True),  # perfhooks sets TEARDOWN_CUPTI=1 while a run lasts
    ("12.4", {}, "warn", False),  # torch keeps CUPTI for CUDA graphs before 12.6: so does perfhooks
    ("12.8", {"TEARDOWN_CUPTI": "0"}, "warn", False),  # the user's choice stands
    ("12.4", {"TEARDOWN_CUPTI": "1"}, "pass", True),
])
def test_the_cupti_check_says_whether_cupti_is_let_go_after_a_window(
        monkeypatch: pytest.MonkeyPatch, cuda_version: str, environ: dict, status: str, detached: bool) -> None:
    from perfhooks.cli.doctor_checks import cupti_check

    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    monkeypatch.setattr(torch.version, "hip", None)
    check = cupti_check(cuda=True, records_cuda=True, environ=environ)
    assert (check.status, check.figure["detached_after_windows"]) == (status, detached), check
    assert ("slows every later step" in check.detail) is (status == "warn")
    assert cupti_check(cuda=False, records_cuda=False).status == "skip"


@pytest.mark.parametrize(("scale", "why"), [(2.0, "longer than the host saw"), (0.5, "shorter than the kernel can")])
def test_events_that_read_twice_or_half_the_time_fail_the_timing_check(scale: float, why: str) -> None:
    """Events reading 2x the kernel read longer than the host's shortest polled reading (of 5 trials: a busy host
    only lengthens them, both cores busy once by 1.44x); at 0.5x shorter than the kernel at the device's peak
    clock, which no load changes."""
    with simulated_cuda() as gpu:
        gpu.event_time_scale = scale
        check = _by_name(doctor("cuda:0"))["device timing"]
    assert check["status"] == "fail" and why in check["detail"], check
    assert check["figure"]["event_ms"] == pytest.approx(50.0 * scale, rel=1e-3)


def test_a_busy_host_that_polls_late_does_not_fail_a_healthy_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's polling, preempted on a busy machine, reads every kernel 40% late (it read 7.9 ms for a 5.8 ms
    kernel with one core busy, and failed the check): the events are within both bounds, and the check passes."""
    from perfhooks.cli import doctor_checks

    polled = doctor_checks._poll_ms
    monkeypatch.setattr(doctor_checks, "_poll_ms", lambda *args: polled(*args) * 1.4)
    with simulated_cuda():
        check = _by_name(doctor("cuda:0"))["device timing"]
    assert check["status"] == "pass", check
    # the simulated events run on the host's clock, so a busy host lengthens them by its delay before the launch (one
    # read 50.013 ms): they read at least the kernel's 50 ms, and no more than the host's (late) reading of the run
    figure = check["figure"]
    assert figure["host_ms"] >= 1.4 * 50.0 and 50.0 <= figure["event_ms"] <= figure["host_ms"]


def test_a_torch_without_memory_history_fails_that_check_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    with simulated_cuda():
        monkeypatch.delattr(torch.cuda.memory, "_record_memory_history")
        checks = _by_name(doctor("cuda:0"))
    assert checks["memory history"]["status"] == "fail"
    assert "_record_memory_history" in checks["memory history"]["detail"]


def test_no_nvtx_warns_and_an_untested_version_warns_with_its_range(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx raises ImportError
    monkeypatch.setattr(metadata, "version", lambda name: "9.0.0" if name == "accelerate" else real(name))
    checks = _by_name(doctor())
    assert checks["nvtx"]["status"] == "warn" and "pip install nvtx" in checks["nvtx"]["detail"]
    assert checks["version: accelerate"]["status"] == "warn"
    assert "tested 1.0 to 1.15" in checks["version: accelerate"]["detail"]


def test_a_bad_device_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "perfhooks", "doctor", "--device", "tpu:0"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "perfhooks doctor: --device must be cuda, cuda:N or cpu, got 'tpu:0'"]
