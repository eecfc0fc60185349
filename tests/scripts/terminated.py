"""A long training run that a signal ends; run by tests/test_signals.py with and without perfhooks, whose exit
status and output must be the same.

    python tests/scripts/terminated.py FRAMEWORK PERF OUTPUT_DIR [--user-handler | --survive]

FRAMEWORK: ``plain`` (a ``perfhooks.profile`` loop), ``hf`` (a ``Trainer`` with logging, evaluation and
checkpoints every 20 steps), ``lightning`` (a ``Trainer`` with its logger, checkpoints, progress bar and validation
every 20 steps) or ``accelerate`` (an ``Accelerator`` loop under ``attach``). PERF: ``1`` or ``0``. The script
prints ``step N`` after each optimizer step (from the framework's own hook), for the test to count and to send
its signal at. ``--user-handler``: a SIGTERM handler of the user's, installed first, prints ``user handler`` and
exits with status 7. ``--survive``: the user's SIGTERM handler only prints ``user handler``, and training runs
:data:`SURVIVE_STEPS` steps in all, to its normal end (exit status 0).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent / "examples")]

import torch  # noqa: E402

import perfhooks  # noqa: E402

#: Steps long enough for a signal to land anywhere; the test signals long before the last one.
STEPS = 5000
#: Steps of a ``--survive`` run: the test signals at step 40, and the run goes on to its end.
SURVIVE_STEPS = 60
SCHEDULE = perfhooks.Schedule(skip_first=5, warmup=1, active=3)


def say(step: int) -> None:
    print(f"step {step}", flush=True)


def plain(output_dir: str, perf: bool) -> None:
    from helpers import mlp

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with (perfhooks.profile(model, optimizer, output_dir=output_dir, schedule=SCHEDULE, console=False) if perf
          else _nothing()) as run:
        for step in range(STEPS):
            with run.data_wait() if perf else _nothing():
                time.sleep(0.01)  # a loader that takes 10 ms: 5000 steps last a minute
                batch = torch.randn(64, 32)
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            say(step + 1)


def hf(output_dir: str, perf: bool) -> None:
    from transformers import TrainerCallback

    from hf_trainer_example import build_trainer
    from perfhooks.integrations.transformers import PerfTrainerCallback

    class Say(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            say(state.global_step)

    callback = PerfTrainerCallback(schedule=SCHEDULE, console=False)
    trainer = build_trainer(output_dir, steps=STEPS, batch_size=4, callback=callback, save_strategy="steps",
                            save_steps=20, eval_strategy="steps", eval_steps=20, logging_steps=20,
                            eval_dataset=_tokens(8))
    if not perf:
        trainer.callback_handler.remove_callback(PerfTrainerCallback)
    trainer.add_callback(Say())
    trainer.train()


def _tokens(samples: int) -> Any:
    from hf_trainer_example import SyntheticTokens

    return SyntheticTokens(samples)


def lightning(output_dir: str, perf: bool) -> None:
    import lightning as L

    from helpers import lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    class Say(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            say(trainer.global_step)

    callbacks: list[Any] = [Say()]
    if perf:
        callbacks.append(PerfCallback(output_dir=Path(output_dir) / "perf", schedule=SCHEDULE, console=False))
    trainer = L.Trainer(default_root_dir=output_dir, max_steps=STEPS, val_check_interval=20,
                        limit_val_batches=2, callbacks=callbacks, accelerator="cpu", devices=1)
    try:
        trainer.fit(lightning_mlp(), random_loader(STEPS), random_loader(4))
    finally:
        print(f"received_sigterm={trainer.received_sigterm}", flush=True)


def accelerate(output_dir: str, perf: bool) -> None:
    from accelerate import Accelerator

    from helpers import mlp, random_loader
    from perfhooks.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True, project_dir=output_dir)
    model = mlp()
    model, optimizer, data = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01),
                                                 random_loader(STEPS))
    with attach(accelerator, model, optimizer, data, schedule=SCHEDULE, console=False) if perf else _nothing():
        for step, (x, y) in enumerate(data):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            say(step + 1)


class _nothing:
    def __enter__(self) -> _nothing:
        return self

    def __exit__(self, *args: Any) -> None:
        return None

    def data_wait(self) -> _nothing:
        return self


def main() -> None:
    framework, perf, output_dir = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    if "--survive" in sys.argv:
        global STEPS
        STEPS = SURVIVE_STEPS
        signal.signal(signal.SIGTERM, lambda signum, frame: print("user handler", flush=True))
    if "--user-handler" in sys.argv:
        def user_handler(signum: int, frame: Any) -> None:
            print("user handler", flush=True)
            raise SystemExit(7)

        signal.signal(signal.SIGTERM, user_handler)
    {"plain": plain, "hf": hf, "lightning": lightning, "accelerate": accelerate}[framework](output_dir, perf)


if __name__ == "__main__":
    main()
