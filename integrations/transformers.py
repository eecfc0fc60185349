"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[PerfTrainerCallback()])``.

Event mapping (no Trainer subclass, no change to ``TrainingArguments`` or ``report_to``):

====================================  =========================================
transformers / torch                  engine
====================================  =========================================
``on_epoch_begin``                    ``phase_start("data_wait")``
model forward pre-hook                ``phase_start("forward")`` (ends the wait)
model forward post-hook               ``phase_start("backward")``
``on_substep_end``                    ``phase_end("backward")`` (accumulation micro-batch)
``on_pre_optimizer_step``             ``phase_start("optimizer")``
``on_optimizer_step``                 ``phase_end("optimizer")``
``on_step_end``                       ``step_end()``, then ``phase_start("data_wait")``
``on_evaluate``, ``on_save``          ``idle()``, then ``phase_start("data_wait")``
``on_epoch_end``                      ``idle()``
``on_log``                            headline figures added to ``logs``
``on_train_end``                      ``close()``: report and table
====================================  =========================================

The Trainer calls the model and then ``accelerator.backward`` with nothing observable in
between, so the backward phase runs from the end of the model's forward: a loss computed
outside the model (a custom ``compute_loss``) and gradient clipping count as backward.
Forwards in eval mode, under ``no_grad`` or inside backward (activation checkpointing) are
not training forwards and are ignored. The Trainer has no exception hook: the engine's exit
guard notes an uncaught error and writes the report at exit.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from perfhooks.config import PerfConfig
from perfhooks.engine import Engine
from perfhooks.hooks import HookHandles, watch_training_forward
from perfhooks.phases import BACKWARD, DATA_WAIT, FORWARD, OPTIMIZER
from perfhooks.report import headline_metrics
from perfhooks.sinks.wandb import RunSource, current_run

#: The step metric transformers' WandbCallback logs with every row.
WANDB_STEP_KEY = "train/global_step"


class PerfTrainerCallback(TrainerCallback):
    """Profile ``Trainer.train()``: phases, NVTX, capture windows and ``report.json``.

    Args:
        output_dir: where ``report.json`` and ``traces/`` go; default ``<args.output_dir>/perfhooks``.
        **settings: any :class:`perfhooks.PerfConfig` field (``schedule``, ``max_traces``, ...).
    """

    def __init__(self, output_dir: str | os.PathLike[str] | None = None, **settings: Any) -> None:
        self.config = PerfConfig.from_kwargs("PerfTrainerCallback", {"output_dir": output_dir, **settings})
        self.engine: Engine | None = None
        self._hooks = HookHandles()

    # --------------------------------------------------------------- lifecycle
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        output_dir = self.config.output_dir or Path(args.output_dir or ".") / "perfhooks"
        self.engine = Engine.start(self.config, output_dir, framework="transformers", device=args.device,
                                   start_step=state.global_step, wandb_source=_wandb_source(args))
        if self.engine is None:
            return
        self._run_before_reporting_callbacks()
        if model is not None:
            watch_training_forward(model, self._forward_start, self._forward_end, self._hooks)
            self.engine.watch_model(model)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._hooks.remove()
        if self.engine is not None:
            self.engine.close()

    # --------------------------------------------------------------- training steps
    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if self.engine is not None:
            self.engine.phase_start(DATA_WAIT)

    def _forward_start(self) -> None:
        if self.engine is not None:
            self.engine.phase_start(FORWARD)

    def _forward_end(self) -> None:
        if self.engine is not None:
            self.engine.phase_start(BACKWARD)

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if self.engine is not None:
            self.engine.phase_end(BACKWARD)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        if self.engine is not None:
            self.engine.phase_start(OPTIMIZER)

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
        if self.engine is not None:
            self.engine.phase_end(OPTIMIZER)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if self.engine is not None:
            self.engine.step_end()
            self.engine.phase_start(DATA_WAIT)

    # --------------------------------------------------------------- not training
    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._restart_wait()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self._restart_wait()

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self.engine is not None:
            self.engine.idle()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.engine is not None and logs is not None and self.engine.stats.steps:
            logs.update(headline_metrics(self.engine.report()))

    # --------------------------------------------------------------- internals
    def _restart_wait(self) -> None:
        """Evaluation or a checkpoint ran since the last step: that was no data wait."""
        if self.engine is not None:
            self.engine.idle()
            self.engine.phase_start(DATA_WAIT)

    def _run_before_reporting_callbacks(self) -> None:
        """Move this callback to the front of the Trainer's callback list.

        ``on_log`` passes one ``logs`` dict to every callback in turn, and the reporting
        integrations (``report_to``) come first; going before them is how the figures added here
        reach every one of them. The Trainer gives callbacks no handle on that list, so it is
        found as the list that holds this callback and the Trainer's ``DefaultFlowCallback``.
        """
        for referrer in gc.get_referrers(self):
            if isinstance(referrer, list) and any(type(c).__name__ == "DefaultFlowCallback" for c in referrer):
                referrer.remove(self)
                referrer.insert(0, self)
                return


def _wandb_source(args: TrainingArguments) -> RunSource:
    """With ``report_to`` naming wandb, the run its ``WandbCallback`` opens (``wandb.run``), on its step axis."""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    if "wandb" not in report_to and "all" not in report_to:
        return RunSource()
    return RunSource(current_run, WANDB_STEP_KEY)
