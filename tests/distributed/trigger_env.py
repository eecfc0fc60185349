"""What the multi-rank scripts read from the environment for the all-ranks trigger tests.

PER_RANK_DIRS: each rank writes to OUTPUT_DIR/rank<R> (node-local disks). NO_SCHEDULE: no scheduled window.
TRIGGER_RANKS and TRIGGER_STEP: those ranks touch their folder's TRIGGER file at the start of that optimizer
step. STEP_MS: every rank sleeps that long in each step. STEPS: optimizer steps to train.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import perfhooks


def rank_folder(output_dir: str, rank: int) -> str:
    return str(Path(output_dir) / f"rank{rank}") if os.environ.get("PER_RANK_DIRS") else output_dir


def schedule(default: perfhooks.Schedule) -> perfhooks.Schedule | None:
    return None if os.environ.get("NO_SCHEDULE") else default


def steps(default: int) -> int:
    return int(os.environ.get("STEPS", default))


def at_step(output_dir: str, rank: int, step: int) -> None:
    """The test's user: sleep STEP_MS; on a TRIGGER_RANKS rank at TRIGGER_STEP, touch its folder's TRIGGER."""
    time.sleep(float(os.environ.get("STEP_MS", "0")) / 1e3)
    ranks = {int(r) for r in os.environ.get("TRIGGER_RANKS", "").split(",") if r}
    if rank in ranks and step == int(os.environ.get("TRIGGER_STEP", "-1")):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "TRIGGER").touch()
