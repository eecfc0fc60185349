"""Ctrl-C (KeyboardInterrupt) in the middle of a capture window of a Lightning fit; run by test_reliability.py.

    python tests/scripts/interrupt_in_window.py PERF OUTPUT_DIR

The window records steps 3-5 (warm-up at 2); the interrupt comes in step 4's forward.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfhooks
from helpers import lightning_mlp, quiet_trainer, random_loader
from perfhooks.integrations.lightning import PerfCallback


def main(perf: bool, output_dir: str) -> int:
    model = lightning_mlp()

    def interrupt(module: Any, args: Any) -> None:
        if module.training and model.global_step == 4:
            raise KeyboardInterrupt

    model.net.register_forward_pre_hook(interrupt)
    callbacks = [PerfCallback(output_dir=output_dir, console=False, analyze_windows=False,
                              schedule=perfhooks.Schedule(skip_first=2, warmup=1, active=3))] if perf else []
    quiet_trainer(max_steps=12, callbacks=callbacks).fit(model, random_loader(12))
    print("fit returned", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] == "1", sys.argv[2]))
