"""One contract, checked over every integration with real training loops."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import annotation_names, load_trace
from perfhooks import Schedule
from perfhooks.report.schema import validate_report
from runners import RUNNERS

TESTS = Path(__file__).resolve().parents[1]
INTEGRATIONS = sorted(RUNNERS)


def read_file(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


def read(out: Path) -> dict:
    return read_file(out / "report.json")


@pytest.fixture(params=INTEGRATIONS)
def runner(request: pytest.FixtureRequest):
    return RUNNERS[request.param]


@pytest.mark.parametrize("accumulate", [1, 4])
def test_steps_micro_batches_coverage_and_a_valid_report(runner, tmp_path: Path, accumulate: int) -> None:
    runner.run(tmp_path, steps=4, accumulate=accumulate, schedule=None, forward_s=0.01)
    report = read(tmp_path)
    assert validate_report(report) == []
    assert report["framework"] == runner.name and report["status"] == "completed"
    assert report["steps"] == 4
    assert report["micro_batches"] == 4 * accumulate
    for phase in ("data_wait", "forward", "backward", "optimizer"):
        assert report["phases"][phase]["mean_ms"] > 0, phase
    # each micro-batch's forward holds 10 ms: the step's forward is at least that many, whatever the machine's load
    # (the framework's own per-step work, accelerate's accumulate() and optimizer wrapper, zero_grad, is honestly
    # "other", and with both cores busy it once made these ~1 ms toy steps' coverage 0.46)
    assert report["phases"]["forward"]["mean_ms"] >= 10 * accumulate
    assert 0 < report["coverage"] <= 1.0


def test_light_steps_past_the_warm_up_keep_every_step_counted(runner, tmp_path: Path) -> None:
    """Past the sampler's warm-up, under a budget that affords only the floor's detailed steps (about 1 in 64), most
    steps are light, with the framework's defaults on: every step still counts (steps, micro-batches, the run's
    training time), the phases come from the detailed ones, and the report says how many of them there are."""
    from perfhooks.runtime.step.sampling import WARMUP_STEPS

    steps = WARMUP_STEPS + 70
    runner.run(tmp_path, steps=steps, accumulate=2, schedule=None, overhead_budget=1e-9)
    report = read(tmp_path)
    assert validate_report(report) == []
    assert report["status"] == "completed" and report["steps"] == steps and report["micro_batches"] == 2 * steps
    overhead = report["overhead"]
    assert overhead["budget"] == 1e-9 and overhead["detailed_steps"] + overhead["light_steps"] == steps
    assert WARMUP_STEPS <= report["phase_steps"] == overhead["detailed_steps"] < WARMUP_STEPS + 15
    assert overhead["in_place_us"]["light"] is not None and overhead["share_of_run"] > 0
    for phase in ("forward", "backward", "optimizer"):
        assert report["phases"][phase]["mean_ms"] > 0, phase
    assert report["run"]["training_s"] > 0


EXAMPLES = {
    "lightning": ("lightning_example", ["--steps", "13"], "report.json"),
    "transformers": ("hf_trainer_example", ["--steps", "13"], "_perfhooks/report.json"),
    "accelerate": ("accelerate_example", ["--steps", "13"], "report.json"),
}


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_the_examples_reach_95_percent_coverage(name: str, tmp_path: Path) -> None:
    import importlib

    module, argv, report_file = EXAMPLES[name]
    assert importlib.import_module(module).main([*argv, "--output-dir", str(tmp_path)]) == 0
    report = read_file(tmp_path / report_file)
    assert report["framework"] == name and report["steps"] == 13
    # 13 steps of ~20 ms (transformers): the Trainer's logging (.item()) and bookkeeping after the optimizer are
    # `other` by design, so one slow logging step on a busy machine moves coverage by points
    assert report["coverage"] >= (0.9 if name == "transformers" else 0.95)
    assert len(report["windows"]) == 1 and Path(report["windows"][0]["path"]).exists()


def test_traces_are_written_under_the_schedule(runner, tmp_path: Path) -> None:
    runner.run(tmp_path, steps=6, schedule=Schedule(skip_first=1, wait=0, warmup=1, active=2, repeat=1))
    report = read(tmp_path)
    assert [(w["first_step"], w["last_step"]) for w in report["windows"]] == [(2, 3)]
    names = set(annotation_names(load_trace(Path(report["windows"][0]["path"]))))
    assert {"ProfilerStep#2", "ProfilerStep#3", "data_wait", "forward", "backward", "optimizer"} <= names


class UsersOwnError(Exception):
    pass


def test_the_users_exception_propagates_unchanged(runner, tmp_path: Path) -> None:
    original = UsersOwnError("raised by the user's model")
    with pytest.raises(UsersOwnError) as caught:
        runner.run(tmp_path, steps=6, schedule=None, fail_with=original)
    assert caught.value is original


def test_construction_twice_and_an_idempotent_close(runner, tmp_path: Path) -> None:
    first = runner.run(tmp_path / "a", steps=2, schedule=None)
    second = runner.run(tmp_path / "b", steps=2, schedule=None)
    engine = first.engine
    assert engine.close() is None, "already closed by the run"
    assert engine.close() is None
    engine.phase_start("forward")  # events after the end are ignored
    engine.step_end()
    assert read(tmp_path / "a")["steps"] == 2 and read(tmp_path / "b")["steps"] == 2
    assert second.engine is not engine


NVTX_RUN = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path[:0] = [{tests!r}, {integrations!r}, {examples!r}]
    from runners import RUNNERS
    RUNNERS[{name!r}].run(Path({out!r}), steps=3, schedule=None)
""")


def test_nvtx_phase_sequence_for_three_steps(runner, tmp_path: Path, nvtx_recorder: Path) -> None:
    log = tmp_path / "nvtx.log"
    script = NVTX_RUN.format(tests=str(TESTS), integrations=str(TESTS / "integrations"),
                             examples=str(TESTS.parent / "examples"), name=runner.name, out=str(tmp_path / "out"))
    env = dict(os.environ, NVTX_INJECTION64_PATH=str(nvtx_recorder), PERFHOOKS_NVTX_LOG=str(log))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    ours = [(kind, message) for kind, domain, message in (line.split("\t") for line in log.read_text().splitlines())
            if domain == "perfhooks"]
    one_step = [event for phase in ("data_wait", "forward", "backward", "optimizer")
                for event in (("push", phase), ("pop", ""))]
    # Lightning and transformers stop at max_steps; the accelerate loop asks its loader once more and finds it empty
    tail = [("push", "data_wait"), ("pop", "")] if runner.name == "accelerate" else []
    assert ours == one_step * 3 + tail
