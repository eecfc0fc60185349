"""``perfhooks run SCRIPT``: unmodified scripts (tests/scripts/launched, which import nothing from perfhooks)
get perfhooks through their framework's construction path; exit status and output stay the script's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import perfhooks
import perfhooks.integrations

SCRIPTS = Path(__file__).parent / "scripts" / "launched"
REPO = Path(__file__).resolve().parents[1]


def launch(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfhooks", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def plain(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def own_lines(stderr: str) -> list[str]:
    """stderr without torch's profiler notes (``USDT: ...``, printed by any torch.profiler session)."""
    return [line for line in stderr.splitlines() if not line.startswith("USDT:")]


def report(folder: Path, name: str = "report.json") -> dict:
    return json.loads((folder / name).read_text())


def test_lightning_script_is_profiled_and_keeps_its_exit_status(tmp_path: Path) -> None:
    out = tmp_path / "perf"
    done = launch("--output-dir", str(out), "--schedule", "skip_first=2,warmup=1,active=2", "--no-wandb",
                  str(SCRIPTS / "lightning_train.py"), str(tmp_path), "12", "3")
    assert done.returncode == 3, done.stderr[-2000:]
    assert "done 12" in done.stdout
    result = report(out)
    assert (result["framework"], result["status"], result["steps"], result["global_step"]) == \
        ("lightning", "completed", 12, 12)
    assert result["run"]["evaluations"] == 2 and result["run"]["checkpoints"] >= 2  # val every 5 steps, its saves
    assert [window["first_step"] for window in result["windows"]] == [3]
    assert list((tmp_path / "lightning_logs").iterdir()), "the script's own logger still wrote its files"


def test_transformers_script_from_the_command_line(tmp_path: Path) -> None:
    """An HfArgumentParser script (like run_clm.py) with evaluation and saving on: the launcher's settings apply
    and the default folder is the integration's (<output_dir>/_perfhooks)."""
    done = launch("--schedule", "skip_first=2,warmup=1,active=2", "--no-wandb",
                  str(SCRIPTS / "transformers_train.py"), "--output_dir", str(tmp_path), "--max_steps", "8",
                  "--report_to", "none", "--eval_strategy", "steps", "--eval_steps", "4", "--save_steps", "4",
                  "--use_cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done 8 ['epoch', 'total_flos', 'train_loss'" in done.stdout  # train()'s metrics have no perf keys
    result = report(tmp_path / "_perfhooks")
    assert (result["framework"], result["steps"], result["global_step"]) == ("transformers", 8, 8)
    assert result["run"]["evaluations"] == 2 and result["run"]["checkpoints"] == 2
    assert [window["first_step"] for window in result["windows"]] == [3]


def test_report_to_perfhooks_is_accepted_and_adds_one_callback(tmp_path: Path) -> None:
    done = launch("--no-wandb", str(SCRIPTS / "transformers_train.py"), "--output_dir", str(tmp_path),
                  "--max_steps", "4", "--report_to", "perfhooks", "--use_cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("perfhooks: 4 steps on") == 1  # one callback: one end-of-run table
    assert report(tmp_path / "_perfhooks")["steps"] == 4


def test_a_failing_script_fails_as_it_does_without_perfhooks(tmp_path: Path) -> None:
    args = [str(SCRIPTS / "transformers_train.py"), "--output_dir", str(tmp_path), "--max_steps", "2",
            "--report_to", "none", "--use_cpu", "--fail"]
    with_perfhooks = launch("--no-wandb", "--no-console", *args)
    without = plain(*args)
    assert with_perfhooks.returncode == without.returncode == 1
    assert own_lines(with_perfhooks.stderr)[-1] == own_lines(without.stderr)[-1] == \
        "ValueError: the script failed after training"
    tail = own_lines(with_perfhooks.stderr)[-6:]
    # the script's frames only: none from perfhooks' package or the launcher (by their folders, not the word
    # "perfhooks", which a clone's own path contains)
    package = str(Path(perfhooks.__file__).resolve().parent)
    integrations = str(Path(perfhooks.integrations.__file__).resolve().parent)
    assert not any(package in line or integrations in line or "runpy" in line for line in tail), tail
    assert tail == own_lines(without.stderr)[-6:]
    assert report(tmp_path / "_perfhooks")["steps"] == 2


def test_accelerate_loop_is_attached_at_its_first_prepare(tmp_path: Path) -> None:
    """The script prepares model and optimizer, then the loader in a second call: all are watched."""
    done = launch("--no-wandb", "--no-console", str(SCRIPTS / "accelerate_train.py"), str(tmp_path), "6")
    assert done.returncode == 0, done.stderr[-2000:]
    result = report(tmp_path / "perfhooks_out")
    assert (result["framework"], result["steps"]) == ("accelerate", 6)  # 12 batches, 2 accumulated per step
    assert result["phases"]["data_wait"]["mean_ms"] > 0 and result["phases"]["backward"]["mean_ms"] > 0


def test_a_plain_loop_gets_one_notice_and_no_harm(tmp_path: Path) -> None:
    done = launch(str(SCRIPTS / "plain_train.py"))
    assert done.returncode == 0 and done.stdout == plain(str(SCRIPTS / "plain_train.py")).stdout
    assert own_lines(done.stderr) == ["perfhooks run: no Lightning Trainer, transformers Trainer or Accelerator "
                                      "was built; nothing was profiled (a plain PyTorch loop adds `with "
                                      "perfhooks.profile(model, optimizer) as perf:`; docs/plain-loop.md)"]


def test_settings_come_from_the_environment_and_bad_ones_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "perf"
    done = launch(str(SCRIPTS / "accelerate_train.py"), str(tmp_path), "4",
                  env={"PERFHOOKS_OUTPUT_DIR": str(out), "PERFHOOKS_WANDB": "0", "PERFHOOKS_CONSOLE": "false",
                       "PERFHOOKS_SCHEDULE": "none"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert report(out)["steps"] == 4 and report(out)["windows"] == []
    assert "perfhooks: 4 steps on" not in done.stderr  # console off
    bad = launch("--max-traces", "0", str(SCRIPTS / "plain_train.py"))
    assert bad.returncode == 2 and bad.stderr.strip() == "perfhooks run: max_traces must be an integer >= 1, got 0"
    bad = launch(str(SCRIPTS / "plain_train.py"), env={"PERFHOOKS_SCHEDULE": "active=two"})
    # the error names the variable the value came from, not an option the user never typed (issue 29, item 17)
    assert bad.returncode == 2 and bad.stderr.strip() == ("perfhooks run: PERFHOOKS_SCHEDULE active must be an "
                                                          "integer, got 'two'")
    bad = launch("--schedule", "activ=2", str(SCRIPTS / "plain_train.py"))
    assert bad.returncode == 2 and "perfhooks run: --schedule takes name=value pairs of" in bad.stderr
    missing = launch("no_such_script.py")
    assert missing.returncode == 2 and missing.stderr.strip() == "perfhooks run: no_such_script.py: no such script"


def test_patches_are_undone_when_the_script_ends(tmp_path: Path) -> None:
    import lightning.pytorch as lp
    from transformers.integrations import integration_utils

    from perfhooks.cli.launch import run

    lightning_init = lp.Trainer.__init__
    finders = list(sys.meta_path)
    code = run(str(SCRIPTS / "lightning_train.py"), [str(tmp_path), "6"],
               {"output_dir": str(tmp_path / "perf"), "wandb": False, "console": False, "schedule": None})
    assert code == 0
    assert lp.Trainer.__init__ is lightning_init and sys.meta_path == finders
    assert "perfhooks" not in integration_utils.INTEGRATION_TO_CALLBACK
    assert report(tmp_path / "perf")["steps"] == 6


@pytest.mark.distributed
def test_under_torchrun_every_rank_is_profiled_and_the_reports_merge(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29631",
         "-m", "perfhooks", "run", "--no-wandb", "--no-console", str(SCRIPTS / "accelerate_train.py"),
         str(tmp_path), "6"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "perfhooks_out"
    assert [report(folder, f"report.rank{r}.json")["steps"] for r in (0, 1)] == [3, 3]  # each rank half the data
    merged = report(folder)
    assert merged["world_size"] == 2 and merged["ranks"]["count"] == 2


def test_a_trainer_that_has_perfhooks_already_gets_no_second_one(tmp_path: Path) -> None:
    import lightning as L
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from perfhooks.cli.launch import Launcher
    from perfhooks.integrations.lightning import PerfCallback
    from perfhooks.integrations.transformers import PerfTrainerCallback

    launcher = Launcher({"wandb": False})
    launcher.install()
    try:
        own = PerfCallback(output_dir=tmp_path / "own")
        mine = L.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), callbacks=[own])
        added = L.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), callbacks=None)
        theirs = PerfTrainerCallback()
        hf = Trainer(model=GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1)),
                     args=TrainingArguments(str(tmp_path / "hf"), report_to="none", use_cpu=True),
                     callbacks=[theirs])
    finally:
        launcher.finish()
    assert [c for c in mine.callbacks if isinstance(c, PerfCallback)] == [own]
    assert len([c for c in added.callbacks if isinstance(c, PerfCallback)]) == 1
    assert [c for c in hf.callback_handler.callbacks if isinstance(c, PerfTrainerCallback)] == [theirs]


def test_run_help_lists_every_setting_with_its_variable() -> None:
    """Issue 29, item 14: ``perfhooks run --help`` shows every PerfConfig setting, its default and its variable."""
    from dataclasses import fields

    from perfhooks.cli.launch import _NOT_OPTIONS
    from perfhooks.cli.main import build_parser
    from perfhooks.config import PerfConfig

    launch_parser = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    text = " ".join(launch_parser.format_help().split())
    for item in fields(PerfConfig):
        if item.name in _NOT_OPTIONS:
            continue
        flag = "--" + item.name.replace("_", "-")
        assert f"{flag} " in text and f"PERFHOOKS_{item.name.upper()})" in text, item.name
    assert "--max-traces MAX_TRACES most trace files kept per rank; the oldest are deleted first. (default 5; " \
           "PERFHOOKS_MAX_TRACES)" in text
    assert "(default True, off with --no-record-shapes; PERFHOOKS_RECORD_SHAPES)" in text


@pytest.mark.parametrize("script", ["plain_profiled.py", "transformers_with_callback.py"])
def test_a_script_that_already_uses_perfhooks_gets_no_nothing_was_profiled(tmp_path: Path, script: str) -> None:
    """Issue 41, item 2: a script with its own perfhooks.profile or PerfTrainerCallback, under perfhooks run,
    printed its table and then "nothing was profiled" (for nanoGPT, with advice to add the line it had)."""
    done = launch("--no-wandb", "--no-console", str(SCRIPTS / script), str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not any("nothing was profiled" in line for line in own_lines(done.stderr)), done.stderr[-2000:]
    assert report(tmp_path if script.startswith("plain") else tmp_path / "_perfhooks")["steps"] in (3, 4)


def test_add_to_trainer_logs_is_an_option_of_perfhooks_run(tmp_path: Path) -> None:
    """Issue 41, item 8: docs/usage.md said the figures go into the Trainer's logs; they do with this option."""
    args = (str(SCRIPTS / "transformers_train.py"), "--output_dir", str(tmp_path), "--max_steps", "4",
            "--logging_steps", "2", "--report_to", "none", "--save_strategy", "no")
    own = launch("--no-wandb", "--no-console", *args)
    added = launch("--no-wandb", "--no-console", "--add-to-trainer-logs", *args)
    assert own.returncode == added.returncode == 0, added.stderr[-2000:]
    assert "perf/step_ms" not in own.stdout + own.stderr
    assert "perf/step_ms" in added.stdout + added.stderr


SCRIPT_GLOBALS = '''
import pickle
import sys
import traceback


class Point:
    pass


frames = traceback.extract_stack()
names = [frame.name for frame in frames]
print("above", len(frames) - 1, names)
print("globals", __name__, __file__, __package__, __spec__, type(__loader__).__name__, __cached__, __doc__, sys.argv[0])
print("main", sys.modules["__main__"].Point is Point, type(pickle.loads(pickle.dumps(Point()))) is Point)
'''


def test_a_script_runs_in_main_as_python_runs_it_with_no_frame_of_runpy_above_it(tmp_path: Path) -> None:
    """The script's module globals, ``sys.modules['__main__']`` (a class it defines pickles) and ``sys.argv[0]`` as
    under python; one frame under the script's, none of runpy's or the launcher's: anomaly mode formats every
    frame of the stack at each operation, so each one costs the script (``perfhooks.cli.launch.BOOT``)."""
    script = tmp_path / "globals.py"
    script.write_text(SCRIPT_GLOBALS)
    with_perfhooks = launch("--no-wandb", "--no-console", str(script))
    without = plain(str(script))
    assert with_perfhooks.returncode == without.returncode == 0, with_perfhooks.stderr[-2000:]
    ours, theirs = with_perfhooks.stdout.splitlines(), without.stdout.splitlines()
    assert ours[1:] == theirs[1:] and theirs[2] == "main True True"
    above = ours[0].split("[", 1)[1]
    assert "'run_path'" not in above and "'_run_module_code'" not in above
    # one frame above the script: the program of the interpreter perfhooks run starts (perfhooks.cli.launch.BOOT)
    assert ours[0] == "above 1 ['<module>', '<module>']" and theirs[0] == "above 0 ['<module>']"


def test_an_interrupted_script_prints_pythons_traceback_and_status(tmp_path: Path) -> None:
    """An uncaught KeyboardInterrupt: the interpreter's own traceback (the script's frames only) and exit by SIGINT;
    ``sys.argv`` as python gives it (the script's path as typed)."""
    script = tmp_path / "interrupted.py"
    script.write_text("import sys\nprint(sys.argv)\nraise KeyboardInterrupt\n")
    with_perfhooks = subprocess.run([sys.executable, "-m", "perfhooks", "run", "--no-wandb", "--no-console",
                                     "interrupted.py", "a"], capture_output=True, text=True, timeout=300,
                                    cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    without = subprocess.run([sys.executable, "interrupted.py", "a"], capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
    assert with_perfhooks.returncode == without.returncode != 0
    assert with_perfhooks.stdout == without.stdout == "['interrupted.py', 'a']\n"
    ours = [line for line in own_lines(with_perfhooks.stderr) if not line.startswith("perfhooks run:")]
    assert ours == own_lines(without.stderr)
