"""One 60-step run for the gate's framework tests (tests/test_gate.py), in a process of its own, so that the four
runs a test compares go side by side under the same load.

    python gate_run.py lightning|transformers ROOT STEP_S BATCH [BARRIER_DIR COUNT]

Each step holds the host ``STEP_S`` longer than the framework's own work (the work a slower commit adds). Prints
the perfhooks output folder.

With a barrier, the ``COUNT`` runs sharing ``BARRIER_DIR`` measure the same stretch of the machine's time: each waits
for all before its first step, and after its last it keeps its own load (the share of a core its fit used) until all
have ended. Without it, a run whose tail outlasts the others' runs that tail alone, faster under load than any step
the others measured.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # hf_trainer_example

STEPS = 150
BARRIER_TIMEOUT_S = 120.0
JITTER_S = 0.010


class Barrier:
    """A barrier across processes made of files in one folder: ``arrive(stage)`` marks this run there, and
    ``all_arrived(stage)`` tells whether ``count`` runs have. No run waits past :data:`BARRIER_TIMEOUT_S`."""

    def __init__(self, folder: Path | None, count: int, name: str) -> None:
        self.folder, self.count, self.name = folder, count, name

    def arrive(self, stage: str) -> None:
        if self.folder is not None:
            (self.folder / f"{stage}.{self.name}").touch()

    def all_arrived(self, stage: str) -> bool:
        return self.folder is None or len(list(self.folder.glob(f"{stage}.*"))) >= self.count

    def wait(self, stage: str) -> None:
        """Arrive at ``stage`` and wait for every run (polled each 5 ms)."""
        self.arrive(stage)
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while not self.all_arrived(stage) and time.monotonic() < deadline:
            time.sleep(0.005)

    def hold_load_until_all_ended(self, cpu_share: float, period_s: float = 0.05) -> None:
        """Arrive at ``end``; until every run has, each ``period_s`` spin ``cpu_share`` of it and sleep the rest."""
        self.arrive("end")
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        busy_s = max(0.0, min(1.0, cpu_share)) * period_s
        while not self.all_arrived("end") and time.monotonic() < deadline:
            spin_until = time.perf_counter() + busy_s
            while time.perf_counter() < spin_until:
                pass
            time.sleep(period_s - busy_s)


class StepGate:
    """:meth:`hold` at the start of every step. Its first call waits for every run's first step, then notes the
    wall and CPU clocks, so that :meth:`cpu_share` is the share of a core the steps used (0..1).

    Each hold adds a random 0..:data:`JITTER_S` (seeded by the run's name). Runs of one step time that start
    together would otherwise wake in the same order every step, so that under load one of them waits on the others
    every step: two identical runs then read 10% apart for the whole run."""

    def __init__(self, barrier: Barrier) -> None:
        self.barrier = barrier
        self.started: tuple[float, float] | None = None
        self.jitter = random.Random(barrier.name)

    def hold(self, step_s: float) -> None:
        if self.started is None:
            self.barrier.wait("start")
            self.started = (time.perf_counter(), time.process_time())
        time.sleep(step_s + self.jitter.uniform(0.0, JITTER_S))

    def cpu_share(self) -> float:
        if self.started is None:
            return 0.0
        wall, cpu = self.started
        return (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)


def lightning_fit(root: Path, step_s: float, batch: int, step_gate: StepGate) -> Path:
    """A Lightning fit with its defaults on (logger, checkpoint, progress bar, summary)."""
    from helpers import default_trainer, lightning_mlp, random_loader
    from perfhooks.integrations.lightning import PerfCallback

    module = lightning_mlp()
    step = module.training_step

    def slower_step(batch_: object, batch_idx: int) -> torch.Tensor:
        step_gate.hold(step_s)
        return step(batch_, batch_idx)

    module.training_step = slower_step  # type: ignore[method-assign]
    trainer = default_trainer(root, max_steps=STEPS, limit_val_batches=2,
                              callbacks=[PerfCallback(console=False, wandb=False, schedule=None)])
    trainer.fit(module, random_loader(STEPS, batch_size=batch), random_loader(2, batch_size=batch))
    return root / "lightning_logs" / "version_0" / "perfhooks"


def hf_run(root: Path, step_s: float, batch: int, step_gate: StepGate) -> Path:
    """A real HF Trainer (transformers' defaults for logging, tqdm and ``report_to``) on a small GPT-2; its
    forward holds the host ``step_s``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from hf_trainer_example import SyntheticTokens
    from perfhooks.integrations.transformers import PerfTrainerCallback

    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1, n_head=2))

    def slower_forward(*_: object) -> None:
        step_gate.hold(step_s)

    model.register_forward_pre_hook(slower_forward)
    args = TrainingArguments(output_dir=str(root), max_steps=STEPS, per_device_train_batch_size=batch,
                             save_strategy="no", use_cpu=True, logging_steps=10)
    Trainer(model=model, args=args, train_dataset=SyntheticTokens(STEPS * batch, seq_len=16, vocab=128),
            callbacks=[PerfTrainerCallback(console=False, schedule=None)]).train()
    return root / "_perfhooks"


if __name__ == "__main__":
    framework, root, step_s, batch = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    barrier = Barrier(Path(sys.argv[5]), int(sys.argv[6]), root.name) if len(sys.argv) > 6 else Barrier(None, 1, "")
    torch.manual_seed(0)
    run = {"lightning": lightning_fit, "transformers": hf_run}[framework]
    step_gate = StepGate(barrier)
    folder = run(root, step_s, batch, step_gate)
    barrier.hold_load_until_all_ended(step_gate.cpu_share())
    print(folder)
