"""Runs that fail, are caught and retried, as notebooks, sweeps and ``auto_find_batch_size`` do; run by
tests/test_lifecycle.py with and without perfhooks, whose exit status and output must be the same.

    python tests/scripts/caught_and_retried.py MODE PERF OUTPUT_DIR

MODE: ``caught_oom`` (a real CPU OOM in a capture window, caught by the caller, then a second
``Trainer(...).train()``), ``auto_find`` (``auto_find_batch_size=True``: the first attempt runs out of
memory at batch size 8), ``uncaught`` (the user's error leaves ``train()`` and the program).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2] / "examples")]

import torch  # noqa: E402

import perfhooks  # noqa: E402
from hf_trainer_example import build_trainer  # noqa: E402
from perfhooks.integrations.transformers import PerfTrainerCallback  # noqa: E402


def out_of_memory() -> None:
    """A real CPU out-of-memory error: the allocator refuses 2**60 bytes."""
    torch.empty(2**60, dtype=torch.uint8)


def trainer(output_dir: str, perf: bool, steps: int, console: bool = False, **args: Any) -> Any:
    callback = PerfTrainerCallback(console=console, analyze_windows=False,
                                   schedule=perfhooks.Schedule(skip_first=8, warmup=1, active=3)) if perf else None
    built = build_trainer(output_dir, steps=steps, batch_size=8, callback=callback, **args)
    if not perf:
        built.callback_handler.callbacks = [c for c in built.callback_handler.callbacks
                                            if not isinstance(c, PerfTrainerCallback)]
    return built


def main(mode: str, perf: bool, output_dir: str) -> int:
    if mode == "caught_oom":
        first = trainer(output_dir, perf, steps=16)
        calls = {"n": 0}

        def oom_at_step_10(module: Any, args: Any) -> None:
            if module.training and torch.is_grad_enabled():
                calls["n"] += 1
                if calls["n"] == 11:  # inside the window (steps 9-11 recorded)
                    out_of_memory()

        first.model.register_forward_pre_hook(oom_at_step_10)
        try:
            first.train()
        except RuntimeError as error:
            print("caught:", str(error).split(".")[1].strip()[:40], flush=True)
        second = trainer(output_dir, perf, steps=12)
        print("second run loss:", round(second.train().training_loss, 4), flush=True)
    elif mode == "auto_find":
        retried = trainer(output_dir, perf, steps=12, auto_find_batch_size=True)

        def oom_above_4(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            if module.training and kwargs["input_ids"].shape[0] > 4:
                out_of_memory()

        retried.model.register_forward_pre_hook(oom_above_4, with_kwargs=True)
        result = retried.train()
        print("steps:", result.global_step, "batch size:", retried._train_batch_size, flush=True)
    elif mode == "uncaught":
        failing = trainer(output_dir, perf, steps=12, console=True)  # no table may follow the traceback

        def fail(module: Any, args: Any) -> None:
            if module.training and torch.is_grad_enabled():
                raise ValueError("the user's own bug")

        failing.model.register_forward_pre_hook(fail)
        failing.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2] == "1", sys.argv[3]))
