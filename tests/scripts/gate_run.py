"""One 60-step run for the gate's framework tests (tests/test_gate.py), in a process of its own, so that the four
runs a test compares go side by side under the same load.

    python gate_run.py lightning|transformers ROOT STEP_S BATCH

Each step holds the host ``STEP_S`` longer than the framework's own work (the work a slower commit adds). Prints
the perfhooks output folder.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # hf_trainer_example

STEPS = 60


def lightning_fit(root: Path, step_s: float, batch: int) -> Path:
    """A Lightning fit with its defaults on (logger, checkpoint, progress bar, summary)."""
    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    module = lightning_mlp()
    step = module.training_step

    def slower_step(batch_: object, batch_idx: int) -> torch.Tensor:
        time.sleep(step_s)
        return step(batch_, batch_idx)

    module.training_step = slower_step  # type: ignore[method-assign]
    trainer = default_trainer(root, max_steps=STEPS, limit_val_batches=2,
                              callbacks=[PerfCallback(console=False, wandb=False, schedule=None)])
    trainer.fit(module, random_loader(STEPS, batch_size=batch), random_loader(2, batch_size=batch))
    return root / "lightning_logs" / "version_0" / "perfhooks"


def hf_run(root: Path, step_s: float, batch: int) -> Path:
    """A real HF Trainer (transformers' defaults for logging, tqdm and ``report_to``) on a small GPT-2; its
    forward holds the host ``step_s``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from hf_trainer_example import SyntheticTokens
    from perfhooks.integrations.transformers import PerfTrainerCallback

    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    model.register_forward_pre_hook(lambda *_: time.sleep(step_s))
    args = TrainingArguments(output_dir=str(root), max_steps=STEPS, per_device_train_batch_size=batch,
                             save_strategy="no", use_cpu=True, logging_steps=10)
    Trainer(model=model, args=args, train_dataset=SyntheticTokens(STEPS * batch, seq_len=16, vocab=128),
            callbacks=[PerfTrainerCallback(console=False, schedule=None)]).train()
    return root / "_perfhooks"


if __name__ == "__main__":
    framework, root, step_s, batch = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(0)
    run = {"lightning": lightning_fit, "transformers": hf_run}[framework]
    print(run(root, step_s, batch))
