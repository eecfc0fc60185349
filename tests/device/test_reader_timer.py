"""The timing reader's own interval timer (``DeviceRoom.thread_timer``): on CUDA, ``cudaEventElapsedTime`` through
ctypes, which releases the GIL where torch's ``elapsed_time`` holds it for three runtime calls. Here it is stood in
for by a timer that reads the simulation's events without a device call, so the tests see who calls it and what
torch is still asked."""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any

import pytest
from simulated_gpu import SimulatedGpu
from test_device_calls import plain_loop

from perfhooks.device import cuda_extras
from perfhooks.device.room import DeviceRoom


def _sim_timer(calls: collections.Counter[str], skew_ms: float = 0.0) -> Any:
    """``thread_timer`` for the simulation: the interval between two completed events (ms), plus ``skew_ms`` on
    its first answer; each call counted by thread name."""
    def thread_timer(room: DeviceRoom) -> Any:
        def timer(start: Any, end: Any) -> float:
            calls[threading.current_thread().name] += 1
            skew = skew_ms if sum(calls.values()) == 1 else 0.0
            return start.raw_elapsed_ms(end) + skew

        return timer

    return thread_timer


def test_the_reader_reads_every_interval_through_its_timer_and_torch_once(
        tmp_path: Path, on_cuda: SimulatedGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the reader's thread uses the timer; torch's ``elapsed_time`` is asked once to check its first answer,
    and otherwise only by the close for the steps left when the reader stopped. The phases are still the
    device's."""
    calls: collections.Counter[str] = collections.Counter()
    monkeypatch.setattr(DeviceRoom, "thread_timer", _sim_timer(calls))
    counts = plain_loop(on_cuda, tmp_path, profiled=True)  # asserts backward p50 >= BACKWARD_MS: device times
    assert set(calls) == {"perfhooks-timings"} and calls["perfhooks-timings"] > 0, calls
    torch_reads = counts.per_step(thread="perfhooks-timings").get("elapsed_time", 0.0)
    assert torch_reads * 40 <= 1, f"the reader asked torch {torch_reads:.2f} times a step"
    assert counts.run["elapsed_time"] + calls["perfhooks-timings"] <= counts.run["event_record"], counts.run


def test_a_timer_whose_first_answer_disagrees_with_torch_is_dropped(
        tmp_path: Path, on_cuda: SimulatedGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """A timer 5 ms off on its first answer is never used again: the reader asks torch for the rest, and the
    report is as without the timer."""
    calls: collections.Counter[str] = collections.Counter()
    monkeypatch.setattr(DeviceRoom, "thread_timer", _sim_timer(calls, skew_ms=5.0))
    counts = plain_loop(on_cuda, tmp_path, profiled=True)
    assert calls == {"perfhooks-timings": 1}
    assert counts.per_step(thread="perfhooks-timings").get("elapsed_time", 0.0) >= 1.0


def test_no_timer_where_no_cuda_runtime_is_loaded() -> None:
    """On this CPU build no ``libcudart`` is mapped into the process: torch's timer serves. The map is read right:
    the C library is found by its name."""
    if cuda_extras._loaded_library("libcudart.so") is not None:
        pytest.skip("a CUDA runtime is loaded here")
    assert cuda_extras.event_timer(0) is None
    libc = cuda_extras._loaded_library("libc.so") or cuda_extras._loaded_library("libc-")
    assert libc is not None and Path(libc).exists()


def test_the_timer_is_made_at_the_first_interval_not_when_the_reader_starts(
        tmp_path: Path, on_cuda: SimulatedGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the timer sets the reader thread's device, which would initialize CUDA in a process whose program has
    not yet (a fork after it would then break the user's workers): it waits for the first interval to read, whose
    events torch made. Then it is made once."""
    import time

    import perfhooks

    made: list[str] = []
    calls: collections.Counter[str] = collections.Counter()
    timer_for = _sim_timer(calls)

    def thread_timer(room: DeviceRoom) -> Any:
        made.append(threading.current_thread().name)
        return timer_for(room)

    monkeypatch.setattr(DeviceRoom, "thread_timer", thread_timer)
    engine = perfhooks.Engine(perfhooks.PerfConfig(console=False, schedule=None, on_demand=False), tmp_path,
                              "test", device="cuda:0")
    time.sleep(0.05)  # the reader has started and read several times: nothing to read yet
    assert made == []
    for _ in range(5):
        engine.phase_start("forward")
        engine.phase_start("backward")
        engine.step_end()
    time.sleep(0.1)
    engine.close()
    assert made == ["perfhooks-timings"] and calls["perfhooks-timings"] > 0


@pytest.mark.cuda
def test_both_ctypes_timers_read_what_torch_reads_on_a_real_gpu() -> None:
    """On a real GPU the timer that releases the GIL (the default) and the one that holds it (``gpu_check.py``'s
    ``reader_holds_gil``) each read two events around a short kernel as torch's ``elapsed_time`` does."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    expected = start.elapsed_time(end)
    for release_gil in (True, False):
        timer = DeviceRoom("cuda:0").thread_timer(release_gil=release_gil)
        assert timer is not None, f"release_gil={release_gil}"
        assert abs(timer(start, end) - expected) <= cuda_extras.TIMER_TOLERANCE_MS
