"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[PerfTrainerCallback()])``.

Event mapping (no Trainer subclass, no change to ``TrainingArguments`` or ``report_to``):

=======================================  =========================================
transformers / torch                     engine
=======================================  =========================================
``trainer.get_batch_samples`` (wrapped)  ``fetch()``: the step's micro-batches are fetched
``trainer._get_num_items_in_batch``      ends ``data_wait``; timed as named ``other`` work (its
(wrapped)                                ``gather`` across ranks waits for the slowest rank)
model forward pre-hook                   ``phase_start("forward")`` (ends the wait)
model forward post-hook                  ``phase_start("backward")``
``on_substep_end``                       ``phase_end("backward")`` (accumulation micro-batch)
``on_pre_optimizer_step``                ``phase_start("optimizer")``
``on_optimizer_step``                    ``phase_end("optimizer")``
``on_step_end``                          ``stepped(state.global_step)``; the step ends at the next fetch
``trainer.evaluate`` (wrapped)           ``aside("evaluation")``
``trainer._save_checkpoint`` (wrapped)   ``aside("checkpoint")``
``on_epoch_end``                         ``idle()``
``on_train_end``                         hooks and wrapped methods put back
``trainer.train`` returns or raises      ``close()`` / ``exception(error)``: report and table
=======================================  =========================================

The Trainer fetches all of a step's micro-batches at once, in ``get_batch_samples``, after the
previous step's logging, evaluation and saving; that call is the data wait. Logging (and its
``.item()``) is the step's ``other``; evaluation and checkpoint writes are timed in the run
account. The three methods are wrapped on the Trainer instance for the run (found on the call
stack at ``on_train_begin``: callbacks get no handle on it) and restored at its end; a Trainer
subclass's own overrides are what gets wrapped.

A run ends when ``train()`` ends, whichever way: ``trainer.train`` is wrapped on the instance at
``on_init_end`` (or when the launcher adds the callback), for the Trainer's life; the wrapper
calls the Trainer's own ``train`` and returns or raises what it does. An error the user catches
leaves no hook, wrapped method or thread behind, and the report is written then, into a folder
that still exists. A callback added with ``trainer.add_callback`` after construction ends its run
at ``on_train_end`` instead (an error caught around that ``train()`` closes it at the next run or
at exit).

Nothing is added to the Trainer's ``logs``: its printed lines and every ``report_to`` tracker get
what they get without perfhooks, and the figures reach W&B once, through perfhooks' own sink.
``add_to_trainer_logs=True`` adds the ``perf/*`` means to each training log for the other trackers.

The Trainer calls the model and then ``accelerator.backward`` with nothing observable in
between, so the backward phase runs from the end of the model's forward: a loss computed
outside the model (a custom ``compute_loss``) and gradient clipping count as backward.
Forwards in eval mode, under ``no_grad`` or inside backward (activation checkpointing) are
not training forwards and are ignored. The Trainer has no exception hook: the engine's exit
guard notes an uncaught error and writes the report at exit.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import weakref
from pathlib import Path
from typing import Any

from perfhooks.integrations import missing_framework

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ModuleNotFoundError as error:
    if error.name is None or not error.name.startswith("transformers"):
        raise
    raise missing_framework("transformers", "transformers", "transformers") from error

from perfhooks.config import PerfConfig
from perfhooks.events import BACKWARD, CHECKPOINT, DATA_WAIT, EVALUATION, FORWARD, NUM_ITEMS_GATHER, OPTIMIZER
from perfhooks.integrations.recipe import hf_precision, transformers_recipe
from perfhooks.integrations.versions import note_versions
from perfhooks.report.build import interval_metrics
from perfhooks.runtime.engine import Engine, NullEngine, RunEngine
from perfhooks.runtime.hooks.patches import InstancePatches, named_work, noting_errors, timed_aside, wrap_construction
from perfhooks.runtime.hooks.torch_hooks import HookHandles, watch_training_forward
from perfhooks.sinks.wandb import RunSource, current_run

#: The step metric transformers' WandbCallback logs with every row.
WANDB_STEP_KEY = "train/global_step"
#: The default folder under ``args.output_dir``: ``push_to_hub`` ignores names starting with ``_``.
DEFAULT_FOLDER = "_perfhooks"



class PerfTrainerCallback(TrainerCallback):
    """Profile ``Trainer.train()``: phases, NVTX, capture windows and ``report.json``.

    Args:
        output_dir: where ``report.json`` and ``traces/`` go; default ``<args.output_dir>/_perfhooks``
            (``push_to_hub`` skips folders whose name starts with ``_``, so no trace is uploaded).
        add_to_trainer_logs: add the ``perf/*`` means to the Trainer's training logs, for its ``report_to``
            trackers and printed lines (default False: the Trainer's logs are its own).
        **settings: any :class:`perfhooks.PerfConfig` field (``schedule``, ``max_traces``, ...).
    """

    def __init__(self, output_dir: str | os.PathLike[str] | None = None, add_to_trainer_logs: bool = False,
                 **settings: Any) -> None:
        if not isinstance(add_to_trainer_logs, bool):
            raise TypeError(f"PerfTrainerCallback: add_to_trainer_logs must be True or False, "
                            f"got {add_to_trainer_logs!r}")
        self.config = PerfConfig.from_kwargs("PerfTrainerCallback", {"output_dir": output_dir, **settings})
        self.add_to_trainer_logs = add_to_trainer_logs
        self.engine: RunEngine = NullEngine()
        self._hooks = HookHandles()
        self._patches = InstancePatches()
        self._logged_through = -1  # the last step whose figures went into a training log
        self._ends_at_train_exit = False
        self._flos_at_start = (0.0, 0)  # the Trainer's total_flos and global_step when this run started
        self._global_step = 0  # the Trainer's global_step at the last step this run counted
        self._trainer: weakref.ref[Any] | None = None  # the Trainer of the open run
        _TRAIN_EXITS.watch(self)

    # --------------------------------------------------------------- copies
    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickle, deepcopy) carries the settings only, never a run."""
        return {"config": self.config, "add_to_trainer_logs": self.add_to_trainer_logs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.config = state["config"]
        self.add_to_trainer_logs = state.get("add_to_trainer_logs", False)

    # --------------------------------------------------------------- lifecycle
    def _train_exited(self, trainer: Any, error: BaseException | None) -> None:
        """``trainer.train()`` returned or raised: the run on it ends here, after every callback and the progress
        bar, with the step the Trainer completed before an error counted (an earlier callback's ``on_step_end``
        can raise after ``global_step`` moved, before this callback's ran)."""
        if self._trainer is None or self._trainer() is not trainer:
            return
        self._trainer = None
        if not self.engine.closed:
            step = getattr(getattr(trainer, "state", None), "global_step", None)
            if isinstance(step, int) and step > self._global_step:
                self._global_step = step
                self.engine.stepped(step)
                self.engine.step_end()
        self._end_run(error)

    def _end_run(self, error: BaseException | None) -> None:
        self._detach()
        if self.engine.closed:
            return
        if error is None:
            self.engine.close()
        else:
            self.engine.exception(error)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        if not self.engine.closed:  # a retry (auto_find_batch_size) of a failed train()
            self._detach()
            self.engine.abandon(quiet=True, superseded=True)
        output_dir = self.config.output_dir or Path(args.output_dir or ".") / DEFAULT_FOLDER
        self._logged_through = -1
        trainer = _calling_trainer(self)
        self._ends_at_train_exit = trainer is not None and _TRAIN_EXITS.inside(trainer)
        self._trainer = weakref.ref(trainer) if self._ends_at_train_exit else None
        self._global_step = state.global_step
        self.engine = Engine.start(self.config, output_dir, framework="transformers", device=args.device,
                                   start_step=state.global_step, wandb_source=_wandb_source(args),
                                   ends_explicitly=True)
        note_versions(self.engine, "transformers")
        if not self.engine.active:
            return
        self._flos_at_start = (state.total_flos, state.global_step)
        self.engine.note_recipe(lambda: transformers_recipe(args, model))
        for flag, dtype in (("bf16", "bf16"), ("fp16", "fp16")):
            if getattr(args, flag, False):
                self.engine.note_precision(dtype, hf_precision(args, type(args).__name__)[1])
        if trainer is not None:
            if self.add_to_trainer_logs:
                self._run_before_reporting_callbacks(trainer)
            self._wrap_trainer(trainer, self.engine)
            # a train() that is not Trainer.train (a subclass's own) may raise past on_train_end: the run then
            # ends when the Trainer is collected, or goes idle after the error (perfhooks.runtime.ending.orphans)
            self.engine.owner.follow(trainer, "Trainer", lambda owner: owner.state.global_step)
            self.engine.on_release.append(self._detach)
        else:
            self.engine.once.warn("hf_trainer", "the Trainer running this callback was not found on the call stack; "
                                  "data wait, evaluation and checkpoints are not timed apart")
        if model is not None:
            watch_training_forward(model, self._forward_start, self._forward_end, self._hooks)
            self.engine.watch_model(model)
        if optimizer is not None:
            self.engine.watch_optimizer(optimizer)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Training is over: the run closes when ``train()`` returns (after every callback, the progress bar
        closed), or here for a callback added after the Trainer was built. The Trainer's own FLOPs count
        (``state.total_flos``: 6 x parameters x tokens, summed over processes) gives the FLOPs per step."""
        self._note_trainer_flops(args, state)
        self._detach()
        if self._ends_at_train_exit:
            self.engine.training_ended()
        else:
            self.engine.close()

    def _note_trainer_flops(self, args: TrainingArguments, state: TrainerState) -> None:
        flos, step = self._flos_at_start
        steps = state.global_step - step
        if steps > 0 and state.total_flos > flos:
            per_step = (state.total_flos - flos) / steps / max(1, getattr(args, "world_size", 1) or 1)
            self.engine.note_flops(per_step, "transformers: TrainerState.total_flos (6 x parameters x tokens)")

    # --------------------------------------------------------------- training steps
    def _forward_start(self) -> None:
        self.engine.phase_start(FORWARD)

    def _forward_end(self) -> None:
        self.engine.phase_start(BACKWARD)

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.engine.phase_end(BACKWARD)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        self.engine.phase_start(OPTIMIZER)

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
        self.engine.phase_end(OPTIMIZER)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.engine.phase_end(OPTIMIZER)
        self._global_step = state.global_step
        self.engine.stepped(state.global_step)

    # --------------------------------------------------------------- not training
    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.engine.idle()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """With ``add_to_trainer_logs``: a training step's logs (they have ``loss``) get the ``perf/*`` means over
        the steps since the last one, for every ``report_to`` integration after this callback."""
        engine = self.engine
        if not self.add_to_trainer_logs or engine.closed or logs is None or "loss" not in logs:
            return
        fresh = [timing for timing in engine.stats.recent if timing.step > self._logged_through]
        if fresh:
            self._logged_through = fresh[-1].step
            logs.update(interval_metrics(fresh, engine.memory.latest if engine.memory is not None else None))

    # --------------------------------------------------------------- internals
    def _wrap_trainer(self, trainer: Any, engine: Engine) -> None:
        """The fetch, training step, evaluation and checkpoint writes, wrapped on the instance until the run ends."""
        original = self._patches.original  # the Trainer's methods, bound at each call to it held weakly
        get_batch_samples = original(trainer, "get_batch_samples")

        def fetch(*args: Any, **kwargs: Any) -> Any:
            engine.fetch()
            fetched = get_batch_samples(*args, **kwargs)
            engine.fetched(len(fetched[0]))
            for micro_batch in fetched[0]:
                engine.batch(micro_batch)
            return fetched

        self._patches.set(trainer, "get_batch_samples", noting_errors(engine, fetch))
        count_items = getattr(trainer, "_get_num_items_in_batch", None)  # transformers >= 4.50
        if callable(count_items):  # with average_tokens_across_devices, a gather across ranks: not data wait
            self._patches.set(trainer, "_get_num_items_in_batch",
                              named_work(engine, NUM_ITEMS_GATHER, original(trainer, "_get_num_items_in_batch"),
                                         ends=DATA_WAIT))
        training_step, compute_loss = original(trainer, "training_step"), original(trainer, "compute_loss")

        def step(*args: Any, **kwargs: Any) -> Any:
            engine.phase_start(FORWARD)  # the batch is in hand: a compiled model's hooks can't say so
            return training_step(*args, **kwargs)

        def loss(*args: Any, **kwargs: Any) -> Any:
            result = compute_loss(*args, **kwargs)
            if engine.open_phase == FORWARD:  # training (evaluation's losses come with no phase open)
                engine.phase_start(BACKWARD)
            return result

        self._patches.set(trainer, "training_step", noting_errors(engine, step))
        self._patches.set(trainer, "compute_loss", loss)
        for name, kind in (("evaluate", EVALUATION), ("_save_checkpoint", CHECKPOINT)):
            if callable(getattr(trainer, name, None)):
                self._patches.set(trainer, name, timed_aside(engine, kind, original(trainer, name)))

    def _detach(self) -> None:
        self._hooks.remove()
        self._patches.restore()

    def _run_before_reporting_callbacks(self, trainer: Any) -> None:
        """Move this callback to the front of the Trainer's callback list.

        ``on_log`` passes one ``logs`` dict to every callback in turn, and the reporting
        integrations (``report_to``) come first; going before them is how the figures added here
        reach every one of them.
        """
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
            callbacks.insert(0, self)


class _TrainExits:
    """Where a run learns that ``Trainer.train()`` returned or raised, with no attribute on the Trainer.

    ``Trainer.train`` is wrapped on the class while a :class:`PerfTrainerCallback` is alive (put back when the last
    one is collected): a copy's ``train()`` trains the copy, ``del trainer`` frees it at once (nothing refers to it
    but the caller), and a callback added with ``add_callback()`` after the Trainer was built is followed too.
    Each call tells the callbacks in the Trainer's list (read when it ends) that it ended, with its error."""

    def __init__(self) -> None:
        self._alive = 0
        self._original: Any = None
        self._running: dict[int, int] = {}  # id(trainer) -> train() calls in progress on this thread and others

    def watch(self, callback: PerfTrainerCallback) -> None:
        try:
            from transformers import Trainer

            if self._alive == 0 and self._original is None:
                self._install(Trainer)
            self._alive += 1
            weakref.finalize(callback, self._release)
        except Exception as error:  # never into the user's program: runs then end at on_train_end
            print(f"perfhooks: train() is not followed ({type(error).__name__}: {error})", file=sys.stderr)

    def inside(self, trainer: Any) -> bool:
        """Whether ``trainer.train()`` is running (the wrapper will tell this run when it ends)."""
        return self._running.get(id(trainer), 0) > 0

    def _install(self, trainer_class: type) -> None:
        original = trainer_class.__dict__["train"]
        running = self._running

        @functools.wraps(original)
        def train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            key = id(trainer)
            running[key] = running.get(key, 0) + 1
            error: BaseException | None = None
            try:
                return original(trainer, *args, **kwargs)
            except BaseException as raised:
                error = raised
                raise
            finally:
                running[key] -= 1
                if not running[key]:
                    del running[key]
                _tell(trainer, error)

        trainer_class.train = train  # type: ignore[method-assign]
        self._original = (trainer_class, original, train)

    def _release(self) -> None:
        self._alive -= 1
        if self._alive == 0 and self._original is not None:
            trainer_class, original, wrapper = self._original
            if trainer_class.__dict__.get("train") is wrapper:  # someone else's wrapper on top stays, with ours
                trainer_class.train = original
                self._original = None


def _tell(trainer: Any, error: BaseException | None) -> None:
    handler = getattr(trainer, "callback_handler", None)
    for callback in list(getattr(handler, "callbacks", None) or []):
        if isinstance(callback, PerfTrainerCallback):
            try:
                callback._train_exited(trainer, error)
            except Exception as fault:  # a fault inside perfhooks: reported, never into the user's train()
                print(f"perfhooks: ending the run failed ({type(fault).__name__}: {fault})", file=sys.stderr)


_TRAIN_EXITS = _TrainExits()


def _calling_trainer(callback: TrainerCallback) -> Any | None:
    """The ``Trainer`` whose callback handler is calling ``callback`` now (the nearest ``self`` up the stack)."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and callback in candidate.callback_handler.callbacks:
            return candidate
        frame = frame.f_back
    return None


def _wandb_source(args: TrainingArguments) -> RunSource:
    """With ``report_to`` naming wandb, the run its ``WandbCallback`` opens (``wandb.run``), on its step axis."""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    every = _logging_steps(args)
    if "wandb" not in report_to and "all" not in report_to:
        return RunSource(log_every=every)
    return RunSource(current_run, WANDB_STEP_KEY, every)


def _logging_steps(args: TrainingArguments) -> int | None:
    """The Trainer's logging cadence in steps: ``logging_steps`` under the "steps" strategy (a fraction of 1 or
    less is a share of ``max_steps``), else None."""
    strategy = getattr(args, "logging_strategy", "steps")
    strategy = str(getattr(strategy, "value", strategy))  # an IntervalStrategy, or its value
    steps = getattr(args, "logging_steps", None)
    if not strategy.endswith("steps") or not isinstance(steps, (int, float)) or steps <= 0:
        return None
    if steps < 1:
        max_steps = getattr(args, "max_steps", -1)
        return max(1, math.ceil(steps * max_steps)) if isinstance(max_steps, int) and max_steps > 0 else None
    return int(steps)


# ----------------------------------------------------------------------------- perfhooks run
def instrument_constructions(module: Any, launcher: Any) -> Any:
    """For ``perfhooks run``: every ``Trainer`` built from now on gets a ``PerfTrainerCallback`` (with the
    launcher's settings) unless it has one, and ``report_to="perfhooks"`` is accepted. Returns the undo."""
    from transformers.integrations import integration_utils

    registry = integration_utils.INTEGRATION_TO_CALLBACK

    class LaunchedPerfTrainerCallback(PerfTrainerCallback):
        """``report_to="perfhooks"``: transformers builds it with no arguments; the launcher's settings apply."""

        def __init__(self) -> None:
            super().__init__(**launcher.settings, **launcher.transformers_options)
            launcher.attached.append(self)

    def add_callback(trainer: Any) -> None:
        if not any(isinstance(callback, PerfTrainerCallback) for callback in trainer.callback_handler.callbacks):
            callback = PerfTrainerCallback(**launcher.settings, **launcher.transformers_options)
            trainer.add_callback(callback)
            launcher.attached.append(callback)

    restore_init = wrap_construction(module.Trainer, after=add_callback)
    had_name = "perfhooks" in registry
    if not had_name:
        registry["perfhooks"] = LaunchedPerfTrainerCallback

    def undo() -> None:
        restore_init()
        if not had_name:
            registry.pop("perfhooks", None)

    return undo
