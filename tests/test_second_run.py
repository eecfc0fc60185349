"""A second run of the same script in the same folder still imports perfhooks (issue 67): no default output folder
is named like the package. A folder ``perfhooks`` beside a script is a namespace package on ``sys.path[0]``, which
Python finds before an editable install's finder, and the next ``import perfhooks`` fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLAIN = textwrap.dedent("""
    import torch
    import perfhooks

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with perfhooks.profile(model, optimizer, console=False, wandb=False, schedule=None) as perf:
        for _ in range(3):
            with perf.data_wait():
                x = torch.randn(2, 4)
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    print("trained", perfhooks.__version__)
""")

LIGHTNING = textwrap.dedent("""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
    L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              accelerator="cpu").fit(Tiny(), data)
    print("trained")
""")


def _run(folder: Path, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PERFHOOKS_CONSOLE": "0", "PERFHOOKS_WANDB": "0"}
    return subprocess.run([sys.executable, *command], cwd=folder, capture_output=True, text=True, timeout=300,
                          env=env)


def test_a_plain_loop_run_twice_in_its_folder_imports_and_reports(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PLAIN)
    for _ in range(2):
        done = _run(tmp_path, "train.py")
        assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-2000:]
    assert (tmp_path / "perfhooks_out" / "report.json").exists() and not (tmp_path / "perfhooks").exists()


@pytest.mark.slow
def test_perfhooks_run_twice_on_a_lightning_script_without_a_logger(tmp_path: Path) -> None:
    """Lightning without a logger has no log_dir: the report goes to ``./perfhooks_out``, and ``perfhooks run``
    (whose ``-m`` puts the working folder first on ``sys.path``) imports the package the second time too."""
    (tmp_path / "train.py").write_text(LIGHTNING)
    for _ in range(2):
        done = _run(tmp_path, "-m", "perfhooks", "run", "--no-wandb", "--no-console", "train.py")
        assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-2000:]
    assert (tmp_path / "perfhooks_out" / "report.json").exists() and not (tmp_path / "perfhooks").exists()
