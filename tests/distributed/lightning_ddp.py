"""Lightning ``strategy="ddp"`` on 2 CPU processes with PerfCallback; run as a script by test_distributed.py.

    python tests/distributed/lightning_ddp.py OUTPUT_DIR

SLOW_RANK: that rank sleeps SLOW_MS in each training step. WANDB: "1" passes wandb=True (offline).
ACCUMULATE: accumulate_grad_batches. RESUME: fit 6 steps with a checkpoint, then a second Trainer resumes from it
to STEPS. REPEAT: the schedule's repeat (default 1). USER_DEFAULTS: "1" keeps Lightning's defaults on (its logger,
checkpointing, progress bar and model summary) and validates every 10 steps. The all-ranks trigger's variables:
trigger_env.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trigger_env
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import perfhooks
from helpers import default_trainer, lightning_mlp, quiet_trainer, random_loader
from perfhooks.integrations.lightning import PerfCallback


class TouchTrigger(Callback):
    """The user of the test: at an optimizer step on some ranks, touches the TRIGGER file (trigger_env)."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        if batch_idx % trainer.accumulate_grad_batches == 0:
            trigger_env.at_step(self.output_dir, trainer.global_rank, trainer.global_step)


def main(output_dir: str) -> int:
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_MS", "30")) / 1e3
    model = lightning_mlp()

    def slow_rank_pre_hook(module: object, args: object) -> None:
        if model.global_rank == slow_rank and module.training:  # type: ignore[attr-defined]
            time.sleep(slow_s)

    model.net.register_forward_pre_hook(slow_rank_pre_hook)
    # the launcher re-runs this script for rank 1 with LOCAL_RANK set (one node here)
    folder = trigger_env.rank_folder(output_dir, int(os.environ.get("LOCAL_RANK", "0")))
    accumulate = int(os.environ.get("ACCUMULATE", "1"))
    steps = trigger_env.steps(12)

    def fit(max_steps: int, ckpt_path: str | None = None) -> None:
        callback = PerfCallback(output_dir=folder, console=False, analyze_windows=False, trigger_poll_s=0.2,
                                schedule=trigger_env.schedule(perfhooks.Schedule(
                                    skip_first=3, warmup=1, active=2, repeat=int(os.environ.get("REPEAT", "1")))),
                                wandb=True if os.environ.get("WANDB") == "1" else None, wandb_log_every=4)
        callbacks = [callback, TouchTrigger(folder)]
        if os.environ.get("RESUME"):
            callbacks.append(ModelCheckpoint(dirpath=str(Path(output_dir) / "checkpoints"), every_n_train_steps=6,
                                             save_top_k=-1))
        train = random_loader(max(24, 2 * steps * accumulate + 4))
        if os.environ.get("USER_DEFAULTS") == "1":
            trainer = default_trainer(Path(output_dir) / "lightning", max_steps=max_steps, strategy="ddp", devices=2,
                                      accumulate_grad_batches=accumulate, callbacks=callbacks, val_check_interval=10,
                                      limit_val_batches=2)
            trainer.fit(model, train, random_loader(4, seed=1), ckpt_path=ckpt_path)
            return
        trainer = quiet_trainer(max_steps=max_steps, strategy="ddp", accelerator="cpu", devices=2,
                                accumulate_grad_batches=accumulate, enable_checkpointing=bool(os.environ.get("RESUME")),
                                callbacks=callbacks)
        trainer.fit(model, train, ckpt_path=ckpt_path)

    if os.environ.get("RESUME"):
        fit(6)
        fit(steps, ckpt_path=str(Path(output_dir) / "checkpoints" / "epoch=0-step=6.ckpt"))
    else:
        fit(steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
