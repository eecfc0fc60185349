"""Lightning: ``Trainer(callbacks=[PerfCallback()])``.

Hook to event mapping (automatic and manual optimization alike):

=================================  ==========================================
Lightning                          engine
=================================  ==========================================
``on_train_epoch_start``           ``phase_start("data_wait")``
``on_train_batch_start``           ``phase_start("forward")`` (ends the wait)
``on_before_backward``             ``phase_start("backward")``
``on_after_backward``              ``phase_end("backward")``
``on_before_optimizer_step``       ``phase_start("optimizer")``
torch optimizer step post-hook     ``phase_end("optimizer")``
``on_train_batch_end``             ``step_end()`` if ``global_step`` moved, then ``phase_start("data_wait")``
``on_validation_start``, epoch end ``idle()``
``on_exception``                   ``exception(error)``; Lightning re-raises it
``on_train_end``                   ``close()``: report and table
=================================  ==========================================

``on_before_optimizer_step`` opens the optimizer phase, not torch's step pre-hook: Lightning
calls ``optimizer.step(closure)`` and the closure runs forward and backward *inside* it, so
the pre-hook fires before the forward. Lightning has no after-step hook, hence torch's
post-hook. A step ends when ``trainer.global_step`` advanced, so gradient accumulation adds
micro-batches, never steps, and a step that AMP skipped still ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.trainer.states import TrainerFn

from perfhooks.config import PerfConfig
from perfhooks.engine import Engine
from perfhooks.hooks import HookHandles, watch_optimizer_steps
from perfhooks.phases import BACKWARD, DATA_WAIT, FORWARD, OPTIMIZER
from perfhooks.sinks.wandb import RunSource

#: The step metric WandbLogger logs with every row.
WANDB_STEP_KEY = "trainer/global_step"


class PerfCallback(Callback):
    """Profile a Lightning ``fit``: phases, NVTX, capture windows and ``report.json``.

    Args:
        output_dir: where ``report.json`` and ``traces/`` go; default ``<trainer.log_dir>/perfhooks``,
            or ``./perfhooks`` when the trainer has no log dir.
        **settings: any :class:`perfhooks.PerfConfig` field (``schedule``, ``max_traces``, ...).
    """

    def __init__(self, output_dir: str | os.PathLike[str] | None = None, **settings: Any) -> None:
        self.config = PerfConfig.from_kwargs("PerfCallback", {"output_dir": output_dir, **settings})
        self.engine: Engine | None = None
        self._hooks = HookHandles()
        self._resume_state: dict[str, Any] | None = None
        self._global_step = 0

    # --------------------------------------------------------------- lifecycle
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        engine = Engine.start(self.config, self._output_dir(trainer), framework="lightning", device=pl_module.device,
                              start_step=trainer.global_step, wandb_source=_wandb_source(trainer))
        if engine is None:
            return
        if self._resume_state is not None:
            engine.load_state_dict(self._resume_state)
        if isinstance(trainer.profiler, PyTorchProfiler):
            engine.defer_windows_to("Lightning's PyTorchProfiler")
        self.engine = engine
        self._global_step = trainer.global_step
        watch_optimizer_steps(trainer.optimizers, self._after_optimizer_step, self._hooks)
        engine.watch_model(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self.engine is not None:
            self.engine.exception(exception)
        self._finish()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._finish()

    # --------------------------------------------------------------- training steps
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.engine is not None:
            self.engine.phase_start(DATA_WAIT)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.engine is not None:
            self.engine.phase_start(FORWARD)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        if self.engine is not None:
            self.engine.phase_start(BACKWARD)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.engine is not None:
            self.engine.phase_end(BACKWARD)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if self.engine is not None:
            self.engine.phase_start(OPTIMIZER)

    def _after_optimizer_step(self) -> None:
        if self.engine is not None:
            self.engine.phase_end(OPTIMIZER)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        engine = self.engine
        if engine is None:
            return
        if trainer.global_step != self._global_step:
            self._global_step = trainer.global_step
            engine.step_end()
        engine.phase_start(DATA_WAIT)

    # --------------------------------------------------------------- not training
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.engine is not None:
            self.engine.idle()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.engine is not None and trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.engine.phase_start(DATA_WAIT)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.engine is not None:
            self.engine.idle()

    # --------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        if self.engine is not None:
            return self.engine.state_dict()
        return dict(self._resume_state or {"step": 0})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume_state = dict(state_dict)
        if self.engine is not None:
            self.engine.load_state_dict(state_dict)

    # --------------------------------------------------------------- internals
    def _output_dir(self, trainer: Trainer) -> Path:
        if self.config.output_dir is not None:
            return Path(self.config.output_dir)
        log_dir = trainer.log_dir
        return Path(log_dir) / "perfhooks" if log_dir else Path("perfhooks")

    def _finish(self) -> None:
        self._hooks.remove()
        if self.engine is not None:
            self.engine.close()


def _wandb_source(trainer: Trainer) -> RunSource:
    """The run of the trainer's ``WandbLogger`` (its ``experiment``), on Lightning's step axis."""

    def find() -> object | None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                return logger.experiment
        return None

    return RunSource(find, WANDB_STEP_KEY)
