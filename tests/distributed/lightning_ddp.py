"""Lightning ``strategy="ddp"`` on 2 CPU processes with PerfCallback; run as a script by test_distributed.py.

    python tests/distributed/lightning_ddp.py OUTPUT_DIR

SLOW_RANK: that rank sleeps SLOW_MS in each training step. WANDB: "1" passes wandb=True (offline).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfhooks
from helpers import lightning_mlp, quiet_trainer, random_loader
from perfhooks.integrations.lightning import PerfCallback


def main(output_dir: str) -> int:
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_MS", "30")) / 1e3
    model = lightning_mlp()

    def slow_rank_pre_hook(module: object, args: object) -> None:
        if model.global_rank == slow_rank and module.training:  # type: ignore[attr-defined]
            time.sleep(slow_s)

    model.net.register_forward_pre_hook(slow_rank_pre_hook)
    callback = PerfCallback(output_dir=output_dir, console=False, analyze_windows=False,
                            schedule=perfhooks.Schedule(skip_first=3, warmup=1, active=2),
                            wandb=True if os.environ.get("WANDB") == "1" else None, wandb_log_every=4)
    trainer = quiet_trainer(max_steps=12, strategy="ddp", accelerator="cpu", devices=2, callbacks=[callback])
    trainer.fit(model, random_loader(24))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
