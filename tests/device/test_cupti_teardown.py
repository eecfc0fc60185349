"""CUPTI let go after each window: ``TEARDOWN_CUPTI=1`` from a run's first CUDA window to its close, where torch
deems it safe, and the user's environment as it was afterwards."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from simulated_gpu import simulated_cuda
from test_cuda_path import engine_on, step

from perfhooks import Schedule
from perfhooks.device.cupti_teardown import VARIABLE, CuptiTeardown, teardown_is_safe


def always_safe(environ) -> bool:
    return True


def test_set_for_the_run_and_taken_away_at_its_close() -> None:
    environ: dict[str, str] = {"PATH": "/bin"}
    teardown = CuptiTeardown(environ, always_safe)
    assert teardown.arm() and environ[VARIABLE] == "1"
    assert teardown.arm(), "a second window finds it set"
    teardown.release()
    assert environ == {"PATH": "/bin"}
    teardown.release()
    assert environ == {"PATH": "/bin"}, "a second close changes nothing"


@pytest.mark.parametrize("theirs", ["0", "1", ""])
def test_a_value_already_set_is_the_users_and_stays(theirs: str) -> None:
    environ = {VARIABLE: theirs}
    teardown = CuptiTeardown(environ, always_safe)
    assert teardown.arm() is (theirs == "1")
    teardown.release()
    assert environ == {VARIABLE: theirs}


def test_a_value_torch_changed_during_the_run_stays() -> None:
    """torch sets ``"0"`` when a compile with CUDA graphs would crash on a re-init; the close keeps that."""
    environ: dict[str, str] = {}
    teardown = CuptiTeardown(environ, always_safe)
    teardown.arm()
    environ[VARIABLE] = "0"
    teardown.release()
    assert environ == {VARIABLE: "0"}


def test_nothing_is_set_where_teardown_is_not_safe() -> None:
    environ: dict[str, str] = {}
    assert not CuptiTeardown(environ, lambda environ: False).arm()
    assert environ == {}


@pytest.mark.parametrize(("cuda", "hip", "environ", "safe"), [
    (None, None, {}, False),  # a CPU build
    ("12.4", None, {}, False),  # CUDA graphs can crash on a re-init after teardown
    ("12.6", None, {}, True),
    ("13.0", None, {}, True),
    ("13.0", None, {"DISABLE_CUPTI_LAZY_REINIT": "1"}, False),  # an eager re-init: the crash torch works around
    ("12.8", "6.2", {}, False),  # ROCm
    ("twelve", None, {}, False),
])
def test_safe_as_torch_itself_judges_it(monkeypatch, cuda, hip, environ, safe) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    assert teardown_is_safe(environ) is safe


def run_with_a_window(tmp_path: Path, seen: list[str | None], **settings) -> None:
    """A run on the simulated GPU with a window over steps 1-2; ``seen``: the variable at each step's start."""
    with simulated_cuda() as gpu:
        engine = engine_on(tmp_path, schedule=Schedule(skip_first=1, warmup=0, active=2), analyze_windows=False,
                           **settings)
        for _ in range(5):
            seen.append(os.environ.get(VARIABLE))
            step(engine, gpu, forward_ms=0.5)
        time.sleep(0.01)
        engine.close()


def test_a_run_sets_it_from_its_first_cuda_window_to_its_close(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv(VARIABLE, raising=False)
    seen: list[str | None] = []
    run_with_a_window(tmp_path, seen)
    assert seen == [None, None, "1", "1", "1"], "set as the window opened (step 1), kept to the close"
    assert VARIABLE not in os.environ, "the user's environment as it was"


def test_a_run_leaves_it_alone_when_switched_off_or_already_set(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv(VARIABLE, raising=False)
    seen: list[str | None] = []
    run_with_a_window(tmp_path / "off", seen, detach_cupti=False)
    assert seen == [None] * 5 and VARIABLE not in os.environ

    monkeypatch.setenv(VARIABLE, "0")
    seen.clear()
    run_with_a_window(tmp_path / "theirs", seen)
    assert seen == ["0"] * 5 and os.environ[VARIABLE] == "0"
