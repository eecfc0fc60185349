"""An HF Trainer whose callback before perfhooks' sends SIGTERM at step 5's ``on_step_end``: the Trainer has
counted step 5, perfhooks has not yet heard of it. No handler: the default action ends the process. Run by
tests/integrations/test_framework_step.py.

    python tests/scripts/hf_signal_at_step.py OUTPUT_DIR
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent / "examples")]

from transformers import TrainerCallback  # noqa: E402

from hf_trainer_example import build_trainer  # noqa: E402
from perfhooks.integrations.transformers import PerfTrainerCallback  # noqa: E402


class SignalAtStep5(TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 5:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    trainer = build_trainer(sys.argv[1], steps=40, batch_size=4, callback=PerfTrainerCallback(console=False))
    trainer.callback_handler.remove_callback(PerfTrainerCallback)
    for callback in (SignalAtStep5(), PerfTrainerCallback(console=False)):  # the order: the signal first
        trainer.add_callback(callback)
    trainer.train()


if __name__ == "__main__":
    main()
