"""The saved workspace view: built offline (``--dry-run``), naming exactly the keys a real run logs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import default_trainer, lightning_mlp, random_loader
from perfhooks.cli import main
from perfhooks.sinks.wandb import PERF_STEP, WINDOW_FIGURES
from perfhooks.sinks.wandb_workspace import SECTIONS, referenced_keys
from wandb_records import history, summary, wandb_records

wandb = pytest.importorskip("wandb")
pytest.importorskip("wandb_workspaces")


def test_the_view_names_exactly_the_keys_a_run_logs(offline_wandb: Path, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import WandbLogger

    import perfhooks
    from perfhooks.integrations.lightning import PerfCallback

    logger = WandbLogger(offline=True, save_dir=str(offline_wandb))
    callback = PerfCallback(output_dir=tmp_path / "perf", wandb_log_every=5, console=False,
                            schedule=perfhooks.Schedule(skip_first=3, warmup=1, active=2))
    trainer = default_trainer(tmp_path, max_steps=20, logger=logger, callbacks=[callback], val_check_interval=10,
                              limit_val_batches=2)
    trainer.fit(lightning_mlp(), random_loader(20), random_loader(2))
    wandb.finish()
    records = wandb_records(offline_wandb)
    rows = history(records)
    logged = {key.split(".")[0] for row in rows for key in row if key.startswith("perf/")}
    logged |= {key for key in summary(records) if key.startswith("perf/")}
    keys, regexes = referenced_keys()
    # from a window's CUDA trace, and MFU (a GPU's peak): none on CPU
    window_figures = {f"perf/{name}" for name in WINDOW_FIGURES} | {"perf/mfu"}
    assert keys - window_figures <= logged, sorted(keys - window_figures - logged)
    assert all(any(re.fullmatch(regex, key) for key in logged) for regex in regexes)
    row_keys = {key.split(".")[0] for row in rows for key in row if key.startswith("perf/")} - {PERF_STEP}
    unreferenced = {key for key in row_keys if key not in keys and not any(re.fullmatch(r, key) for r in regexes)}
    assert unreferenced == set(), "every perf/* metric a row carries has a panel"


def test_dry_run_prints_the_view_without_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wandb-workspace", "my-team/my-project", "--name", "perf view", "--dry-run"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert (view["entity"], view["project"], view["displayName"]) == ("my-team", "my-project", "perf view")
    sections = view["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == [s["name"] for s in SECTIONS]
    text = json.dumps(view)
    assert "perf/diagnoses" in text and "perf/phase/data_wait_share" in text and "stacked-area" in text


def test_a_bad_project_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wandb-workspace", "no-slash", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == ("perfhooks wandb-workspace: ENTITY/PROJECT must be like "
                                               "my-team/my-project, got 'no-slash'")


def test_saving_without_a_login_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys) -> None:
    """Issue 29, item 16: no W&B login gave a 24-line UsageError traceback and exit 1."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert main(["wandb-workspace", "my-team/my-project"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("perfhooks wandb-workspace: not logged in to W&B (") and "run `wandb login`" in err
