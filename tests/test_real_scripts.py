"""Issue 26: the defects that real scripts and the frameworks' own test suites found, each reproduced as a user
would meet it (the frameworks' defaults on), and fixed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from helpers import default_trainer, lightning_mlp, random_loader, read_report


# ----------------------------------------------------------------------------- item 6: instance patches
def test_a_users_patch_on_the_trainer_is_put_back(tmp_path: Path) -> None:
    """Lightning's own test_model_checkpoint.py patches ``trainer.save_checkpoint`` before fit: the patch is
    still there after the fit, was called, and leaving ``patch.object`` finds its attribute."""
    from perfhooks.integrations.lightning import PerfCallback

    trainer = default_trainer(tmp_path, max_steps=4, callbacks=[PerfCallback(console=False)])
    with mock.patch.object(trainer, "save_checkpoint", wraps=trainer.save_checkpoint) as save:
        trainer.fit(lightning_mlp(), random_loader(4), random_loader(2))
        assert trainer.save_checkpoint is save and save.call_count == 1
    assert "save_checkpoint" not in trainer.__dict__
    assert read_report(tmp_path / "lightning_logs" / "version_0" / "perfhooks")["run"]["checkpoints"] == 1


def test_restoring_puts_back_what_the_instance_held() -> None:
    from perfhooks.runtime.patches import InstancePatches

    class Owner:
        def method(self) -> str:
            return "class"

    owner, users = Owner(), (lambda: "user's")
    owner.method = users  # type: ignore[method-assign]
    patches = InstancePatches()
    patches.set(owner, "method", lambda: "perfhooks")
    patches.set(owner, "other", lambda: "perfhooks")
    patches.restore()
    assert owner.method is users and "other" not in owner.__dict__
    patches.set(owner, "method", lambda: "perfhooks")
    replaced = (lambda: "replaced during the run")
    owner.method = replaced  # type: ignore[method-assign]
    patches.restore()
    assert owner.method is replaced


# ----------------------------------------------------------------------------- items 1-2: the launcher
SCRIPTS = Path(__file__).parent / "scripts" / "launched"


def test_the_launcher_profiles_accelerate_after_a_find_spec(tmp_path: Path) -> None:
    """transformers calls importlib.util.find_spec("accelerate") to see whether it is installed; the real
    import that follows still gets perfhooks, and so does a submodule imported before its package."""
    from test_launch import launch, own_lines, report

    done = launch("--no-wandb", "--no-console", str(SCRIPTS / "accelerate_after_find_spec.py"), str(tmp_path), "4")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not any("nothing was profiled" in line for line in own_lines(done.stderr))
    assert (report(tmp_path / "perfhooks")["framework"], report(tmp_path / "perfhooks")["steps"]) == ("accelerate", 4)


def test_a_finder_keeps_its_hook_until_the_module_runs() -> None:
    import sys
    import types

    from perfhooks.cli.launch import PostImportHooks

    seen: list[types.ModuleType] = []
    hooks = PostImportHooks()
    hooks.add("json.tool", seen.append)  # not imported yet in this process
    sys.modules.pop("json.tool", None)
    hooks.install()
    try:
        import importlib.util

        assert importlib.util.find_spec("json.tool") is not None and seen == []
        import json.tool  # noqa: F401

        assert [module.__name__ for module in seen] == ["json.tool"]
    finally:
        hooks.remove()


@pytest.mark.parametrize("script", ["fails_at_the_top.py", "syntax_error.py"])
def test_a_script_that_fails_before_training_ends_with_its_own_traceback(tmp_path: Path, script: str) -> None:
    """perfhooks' notice comes first; the traceback is the one python prints, with no runpy frame, and last."""
    from test_launch import launch, own_lines, plain

    target = tmp_path / script
    source = SCRIPTS / script if (SCRIPTS / script).exists() else SCRIPTS / f"{script}.txt"
    target.write_text(source.read_text())
    with_perfhooks, without = launch(str(target)), plain(str(target))
    assert with_perfhooks.returncode == without.returncode == 1
    lines = own_lines(with_perfhooks.stderr)
    assert lines[0].startswith("perfhooks run: no Lightning Trainer")
    assert lines[1:] == own_lines(without.stderr)
