"""A run its program leaves open: an HF ``Trainer`` subclass whose ``train()`` runs the training loop itself (never
``Trainer.train``), an error at step 3 that the caller catches, then ``del trainer``. Run by
tests/integrations/test_left_open.py; prints one JSON line of what is left, then sends itself SIGINT in unrelated
code and prints whether it behaved as plain.

    python tests/scripts/left_open.py OUTPUT_DIR
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent / "examples")]

from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from hf_trainer_example import SyntheticTokens, tiny_gpt2  # noqa: E402
from perfhooks.integrations.transformers import PerfTrainerCallback  # noqa: E402

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)


class OwnLoop(Trainer):
    """A subclass with its own ``train()``: Hugging Face's loop, called without ``Trainer.train``."""

    def train(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner_training_loop(batch_size=self._train_batch_size, args=self.args)


class FailAtStep3(TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 3:
            raise RuntimeError("the user's error at step 3")


def main() -> None:
    output_dir = sys.argv[1]
    handlers = {signum: signal.getsignal(signum) for signum in SIGNALS}
    args = TrainingArguments(output_dir=output_dir, max_steps=20, per_device_train_batch_size=4, report_to="none",
                             disable_tqdm=True, use_cpu=True, save_strategy="no", logging_steps=10)
    model = tiny_gpt2()
    trainer = OwnLoop(model=model, args=args, train_dataset=SyntheticTokens(80),
                      callbacks=[PerfTrainerCallback(console=False), FailAtStep3()])
    own = {name for name in vars(Trainer) if callable(vars(Trainer)[name])}
    try:
        trainer.train()
    except RuntimeError as error:
        print(f"caught: {error}", flush=True)
    patched = sorted(name for name in vars(trainer) if name in own)
    del trainer
    gc.collect()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(t.name.startswith("perfhooks") for t in threading.enumerate()):
        time.sleep(0.1)
    report_path = Path(output_dir) / "_perfhooks" / "report.json"
    report = json.loads(report_path.read_text())
    left = {
        "patched_while_open": patched,
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("perfhooks")),
        "handlers_changed": [signal.Signals(s).name for s in SIGNALS if signal.getsignal(s) is not handlers[s]],
        "forward_hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
        "status": report["status"], "error": report.get("error"), "steps": report["steps"],
    }
    print(json.dumps(left), flush=True)
    before = report_path.read_bytes()
    time.sleep(1.5)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C in unrelated code
        time.sleep(1.0)
        print("no KeyboardInterrupt", flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt as plain", flush=True)
    print(f"report rewritten: {report_path.read_bytes() != before}", flush=True)


if __name__ == "__main__":
    main()
