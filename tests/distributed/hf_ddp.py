"""A transformers Trainer on 2 CPU processes (gloo) with PerfTrainerCallback; started by torchrun.

    torchrun --nproc-per-node 2 tests/distributed/hf_ddp.py OUTPUT_DIR

The user's defaults are on: the progress bar, logging, evaluation every 10 steps, a checkpoint every 30 and
``report_to="wandb"`` (offline). The all-ranks trigger's variables: trigger_env.py; SLOW_RANK and SLOW_MS make
one rank sleep after each optimizer step.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch
import trigger_env
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import perfhooks
from hf_trainer_example import SyntheticTokens
from perfhooks.integrations.transformers import PerfTrainerCallback


class TouchTrigger(TrainerCallback):
    """The user of the test: at an optimizer step on some ranks, touches the TRIGGER file (trigger_env)."""

    def __init__(self, output_dir: str, rank: int) -> None:
        self.output_dir, self.rank = output_dir, rank

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        trigger_env.at_step(self.output_dir, self.rank, state.global_step)


class SlowRank(TrainerCallback):
    """SLOW_RANK sleeps SLOW_MS after each optimizer step: a rank with slow host work (logging, a callback)."""

    def __init__(self, rank: int) -> None:
        slow = os.environ.get("SLOW_RANK")
        self.seconds = float(os.environ.get("SLOW_MS", "0")) / 1e3 if slow is not None and int(slow) == rank else 0.0

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.seconds:
            time.sleep(self.seconds)


def main(output_dir: str) -> int:
    rank = int(os.environ["RANK"])
    folder = trigger_env.rank_folder(output_dir, rank)
    steps = trigger_env.steps(12)
    callback = PerfTrainerCallback(output_dir=folder, console=False, analyze_windows=False, trigger_poll_s=0.2,
                                   schedule=trigger_env.schedule(perfhooks.Schedule(skip_first=3, warmup=1, active=2)))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    os.environ.setdefault("WANDB_DIR", output_dir)
    args = TrainingArguments(output_dir=str(Path(output_dir) / "hf"), max_steps=steps, per_device_train_batch_size=4,
                             use_cpu=True, ddp_backend="gloo", logging_steps=10, eval_strategy="steps", eval_steps=10,
                             save_strategy="steps", save_steps=30, report_to="wandb")
    trainer = Trainer(model=model, args=args, callbacks=[callback, TouchTrigger(folder, rank), SlowRank(rank)],
                      train_dataset=SyntheticTokens(steps * 4 * 2, seq_len=16, vocab=128),
                      eval_dataset=SyntheticTokens(2 * 4 * 2, seq_len=16, vocab=128))
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
