"""Lightning: ``Trainer(callbacks=[PerfCallback()])``.

Hook to event mapping (automatic and manual optimization alike):

=========================================  ==========================================
Lightning                                  engine
=========================================  ==========================================
the fetcher's ``train_dataloader_next``    ``fetch()``: ``data_wait`` until the batch is on the device;
(the epoch loop's ``_on_before_fetch``)    a step that stepped ends here
``on_train_batch_start``                   ``phase_start("forward")``
``on_before_backward``                     ``phase_start("backward")``
``on_after_backward``                      ``phase_end("backward")`` (manual: back to ``forward``)
``on_before_optimizer_step``               ``phase_start("optimizer")``
torch optimizer step post-hook             ``phase_end("optimizer")`` (manual: back to ``forward``)
``on_train_batch_end``                     ``stepped(trainer.global_step)`` if it moved
``on_validation_start`` ... ``_end``       ``aside("evaluation")``
``trainer.save_checkpoint`` (wrapped)      ``aside("checkpoint")`` (user calls)
``ModelCheckpoint._save_checkpoint``       ``aside("checkpoint")``: the callback's whole save, with a
(wrapped on each checkpoint callback)      subclass's override and the loggers' ``after_save_checkpoint``
``on_train_epoch_end``                     ``idle()``
``on_exception``                           ``exception(error)``; Lightning re-raises it
``on_train_end``                           ``close()``: report and table
=========================================  ==========================================

The fetch is bracketed where Lightning's own profiler sees it: before each ``next()`` the training
data fetcher calls the epoch loop's ``_on_before_fetch``, which reports ``train_dataloader_next``
to ``trainer.profiler``; that method is wrapped on the instance for the fit and restored at the
end (``trainer.profiler.start`` is the fallback where it does not exist). Everything from the optimizer
step to the next fetch (callbacks, logging, the progress bar, LR schedulers) is the step's
``other``; evaluation and checkpoint writes are taken out of it and timed in the run account.

``on_before_optimizer_step`` opens the optimizer phase, not torch's step pre-hook: Lightning
calls ``optimizer.step(closure)`` and the closure runs forward and backward *inside* it, so
the pre-hook fires before the forward. Lightning has no after-step hook, hence torch's
post-hook. A step is a batch whose optimizer(s) stepped (``trainer.global_step`` moved), so
gradient accumulation adds micro-batches, never steps; a GAN's two optimizers make one step,
and the report's ``global_step`` is Lightning's own (two per batch there). In manual
optimization, everything in ``training_step`` outside backward and the optimizer is forward.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.integrations import missing_framework

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.profilers import PyTorchProfiler
    from lightning.pytorch.trainer.states import TrainerFn
except ModuleNotFoundError as error:
    if error.name is None or not error.name.startswith("lightning"):
        raise
    raise missing_framework("lightning", "lightning", "lightning") from error

from perfhooks.config import DEFAULT_OUTPUT_FOLDER, PerfConfig
from perfhooks.events import BACKWARD, CHECKPOINT, EVALUATION, FORWARD, OPTIMIZER
from perfhooks.integrations.recipe import lightning_recipe
from perfhooks.integrations.versions import note_versions
from perfhooks.runtime.engine import Engine, NullEngine, RunEngine
from perfhooks.runtime.hooks.patches import InstancePatches, timed_aside, wrap_construction
from perfhooks.runtime.hooks.torch_hooks import HookHandles, watch_optimizer_steps
from perfhooks.runtime.throughput.precision import matmul_dtype
from perfhooks.sinks.wandb import RunSource
from perfhooks.timebase import monotonic_ns

#: The step metric WandbLogger logs with every row.
WANDB_STEP_KEY = "trainer/global_step"
#: The prefix of the action Lightning reports to the trainer's profiler around each callback hook.
CALLBACK_ACTION = "[Callback]"


def callback_hook_name(action_name: str) -> str | None:
    """``[Callback]ModelCheckpoint{'monitor': None, ...}.on_train_batch_end`` -> ``ModelCheckpoint.on_train_batch_end``
    (a callback's ``state_key`` carries its settings); ``None`` for perfhooks' own callback."""
    key, _, hook = action_name[len(CALLBACK_ACTION):].rpartition(".")
    name = key.split("{", 1)[0].rpartition(".")[2]  # the state key is the class's qualname (``f.<locals>.Name``)
    if not name or name == PerfCallback.__name__:
        return None
    return f"{name}.{hook}"


#: Steps whose callback hooks are all timed, from the fit's start; then one step in ``NAMED_EVERY``.
NAMED_STEPS_ALL, NAMED_EVERY = 32, 16


class CallbackTiming:
    """The trainer profiler's ``start``/``stop`` replaced by timing wrappers on the steps that time callback
    hooks, and Lightning's own put back on the others: each switch on is an :class:`InstancePatches` of its own,
    which puts back exactly what the instance held (nothing, or the user's own attribute)."""

    def __init__(self, profiler: Any, start: Callable[[str], None], stop: Callable[[str], None],
                 began: dict[str, int]) -> None:
        self.profiler = profiler
        self.wrappers = {"start": start, "stop": stop}
        self.began = began
        self._patches: InstancePatches | None = None

    @property
    def timed(self) -> bool:
        return self._patches is not None

    def on(self) -> None:
        if self._patches is not None:
            return
        self.began.clear()  # a hook cut by a switch is not timed
        self._patches = InstancePatches()
        for name, wrapper in self.wrappers.items():
            self._patches.set(self.profiler, name, wrapper)

    def off(self) -> None:
        """Put back what the profiler held before :meth:`on` (idempotent; an attribute the user replaced since
        stays theirs)."""
        self.began.clear()
        patches, self._patches = self._patches, None
        if patches is not None:
            patches.restore()


#: A hook name not parsed yet (None is a parsed "not a callback's").
_UNPARSED = object()
#: The action Lightning's training data fetcher reports to the trainer's profiler around ``next()``.
FETCH_ACTION = "train_dataloader_next"


class PerfCallback(Callback):
    """Profile a Lightning ``fit``: phases, NVTX, capture windows and ``report.json``.

    Args:
        output_dir: where ``report.json`` and ``traces/`` go; default ``<trainer.log_dir>/perfhooks``,
            or ``./perfhooks`` when the trainer has no log dir.
        **settings: any :class:`perfhooks.PerfConfig` field (``schedule``, ``max_traces``, ...).
    """

    def __init__(self, output_dir: str | os.PathLike[str] | None = None, **settings: Any) -> None:
        self.config = PerfConfig.from_kwargs("PerfCallback", {"output_dir": output_dir, **settings})
        self.engine: RunEngine = NullEngine()
        self._hooks = HookHandles()
        self._resume_state: dict[str, Any] | None = None
        self._global_step = 0
        self._manual = False
        self._patches = InstancePatches()
        #: The trainer profiler's methods swapped for callback timing on the steps that time it (None: not set).
        self._callback_timing: CallbackTiming | None = None

    # --------------------------------------------------------------- copies
    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickle, deepcopy, ``torch.save(trainer)``) carries the settings only, never a run."""
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.config = state["config"]

    # --------------------------------------------------------------- lifecycle
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        engine = Engine.start(self.config, self._output_dir(trainer), framework="lightning", device=pl_module.device,
                              start_step=_steps_done(trainer), global_step=trainer.global_step,
                              wandb_source=_wandb_source(trainer), ends_explicitly=True)
        note_versions(engine, "lightning")
        resume_state, self._resume_state = self._resume_state, None  # a checkpoint of an older perfhooks
        self.engine = engine
        if not engine.active:
            return
        if resume_state is not None:
            engine.load_state_dict(resume_state)
        if isinstance(trainer.profiler, PyTorchProfiler):
            engine.defer_windows_to("Lightning's PyTorchProfiler")
        self._global_step = trainer.global_step
        engine.owner.follow(trainer, "Trainer", lambda owner: owner.global_step)  # its step, for errors and signals
        self._manual = not pl_module.automatic_optimization
        dtype = matmul_dtype(getattr(trainer, "precision", None))
        if dtype is not None:
            engine.note_precision(dtype, f"Lightning Trainer(precision={trainer.precision!r})")
        engine.note_recipe(lambda: lightning_recipe(trainer, pl_module))
        watch_optimizer_steps(trainer.optimizers, self._after_optimizer_step, self._hooks)
        engine.watch_model(pl_module)
        for optimizer in trainer.optimizers or []:
            engine.watch_optimizer(optimizer)
        self._wrap_fetch(trainer, engine)
        self._wrap_checkpoint(trainer, engine)
        self._time_callbacks(trainer, engine)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Lightning re-raises ``exception`` after its hooks; after ``on_train_end`` the report is rewritten
        as failed (an error in a later ``on_train_end``/``on_fit_end`` hook is still the fit's failure). A step
        whose optimizer stepped before the error (in another callback's ``on_train_batch_end``) is counted."""
        self._note_step(trainer)
        self.engine.exception(exception)
        self._finish()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._finish()
        # Lightning gives every callback the module's log/log_dict (bound methods) at setup; a callback the user
        # keeps for the next run of a sweep would keep this model alive through them.
        for name in ("log", "log_dict"):
            if getattr(self.__dict__.get(name), "__self__", None) is pl_module:
                del self.__dict__[name]

    # --------------------------------------------------------------- training steps
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.engine.phase_start(FORWARD)
        self.engine.batch(batch)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        self.engine.phase_start(BACKWARD)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._manual:
            self.engine.phase_start(FORWARD)
        else:
            self.engine.phase_end(BACKWARD)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self.engine.phase_start(OPTIMIZER)

    def _after_optimizer_step(self) -> None:
        if self._manual:
            self.engine.phase_start(FORWARD)
        else:
            self.engine.phase_end(OPTIMIZER)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.engine.phase_end(FORWARD)
        self.engine.phase_end(OPTIMIZER)
        self._note_step(trainer)

    def _note_step(self, trainer: Trainer) -> None:
        """The open step stepped if the trainer's ``global_step`` moved since the last one."""
        if trainer.global_step != self._global_step:
            self._global_step = trainer.global_step
            self.engine.stepped(trainer.global_step)

    # --------------------------------------------------------------- not training
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.engine.aside_start(EVALUATION)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.engine.aside_end(EVALUATION)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.engine.idle()

    # --------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Nothing: a checkpoint written with perfhooks loads in a Trainer without it, with no warning.
        A resumed fit finds its step in Lightning's own loop state (see ``_steps_done``)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A checkpoint from an older perfhooks (``{"step": N}``): used by the next fit only."""
        self._resume_state = dict(state_dict) if state_dict else None

    # --------------------------------------------------------------- internals
    def _output_dir(self, trainer: Trainer) -> Path:
        if self.config.output_dir is not None:
            return Path(self.config.output_dir)
        log_dir = trainer.log_dir
        if trainer.logger is None:  # log_dir is default_root_dir (the working folder): beside the script
            return Path(log_dir or ".") / DEFAULT_OUTPUT_FOLDER
        return Path(log_dir) / "perfhooks" if log_dir else Path(DEFAULT_OUTPUT_FOLDER)

    def _wrap_fetch(self, trainer: Trainer, engine: Engine) -> None:
        """``fetch()`` where the training data fetcher reports ``train_dataloader_next`` to the profiler.

        The epoch loop's ``_on_before_fetch`` is what the fetcher calls before each ``next()`` (bound at
        each epoch's start, after ``on_train_start``): one call per fetch. Where a Lightning version has
        no such method, ``trainer.profiler.start`` is wrapped instead and filters the action name
        (about 50 profiler actions a step with the default callbacks, ~0.2 µs each).
        """
        epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        before_fetch = getattr(epoch_loop, "_on_before_fetch", None)
        if callable(before_fetch):
            def on_before_fetch() -> None:
                engine.fetch()
                self._step_opened()
                before_fetch()

            self._patches.set(epoch_loop, "_on_before_fetch", on_before_fetch)
            return
        profiler = trainer.profiler
        start = profiler.start

        def start_action(action_name: str) -> None:
            if action_name.endswith(FETCH_ACTION):
                engine.fetch()
            start(action_name)

        self._patches.set(profiler, "start", start_action)

    def _time_callbacks(self, trainer: Trainer, engine: Engine) -> None:
        """Each callback hook Lightning reports to ``trainer.profiler`` (``[Callback]Name.hook``, around every
        callback call) is timed on the host and named to the engine: who ran inside the steps. Lightning reports
        about 48 actions a step (24 of them callback hooks), so they are timed in the first
        :data:`NAMED_STEPS_ALL` steps and then one step in :data:`NAMED_EVERY`; between those the profiler's own
        methods are put back (:class:`CallbackTiming`)."""
        profiler = trainer.profiler
        start, stop = getattr(profiler, "start", None), getattr(profiler, "stop", None)
        if not callable(start) or not callable(stop) or "start" in vars(profiler):  # the fetch fallback has it
            return
        began: dict[str, int] = {}
        clock, named = monotonic_ns, engine.named
        #: Each action's hook name, parsed once (about 24 callback hooks a step with the defaults): None for
        #: actions that are not a callback's, or perfhooks' own.
        names: dict[str, str | None] = {}

        def start_action(action_name: str) -> None:
            name = names.get(action_name, _UNPARSED)
            if name is _UNPARSED:
                name = names[action_name] = (callback_hook_name(action_name)
                                             if action_name.startswith(CALLBACK_ACTION) else None)
            if name is not None:
                began[action_name] = clock()
            start(action_name)

        def stop_action(action_name: str) -> None:
            stop(action_name)
            at = began.pop(action_name, None) if began else None
            if at is not None:
                named(names[action_name], (clock() - at) / 1e6)  # type: ignore[arg-type]

        self._callback_timing = CallbackTiming(profiler, start_action, stop_action, began)
        self._callback_timing.on()

    def _step_opened(self) -> None:
        """A training fetch opened a step: its callback hooks are timed or not (the first steps, then one detailed
        step in several; on a light step the profiler's own methods run, unwrapped)."""
        timing = self._callback_timing
        if timing is not None:
            step = self.engine.step
            light = getattr(getattr(self.engine, "tracker", None), "light", False)  # a light step names nothing
            on = not light and (step < NAMED_STEPS_ALL or step % NAMED_EVERY == 0)
            if on != timing.timed:
                timing.on() if on else timing.off()
                self.engine.set_hook_timing(on)

    def _wrap_checkpoint(self, trainer: Trainer, engine: Engine) -> None:
        """``trainer.save_checkpoint`` (what users call) and each checkpoint callback's ``_save_checkpoint`` (the
        whole save: a subclass's override, ``trainer.save_checkpoint`` and the loggers' ``after_save_checkpoint``,
        where W&B uploads with ``log_model``) are timed as checkpoint writes; a save nested in a save is one."""
        original = self._patches.original  # bound at each call to its owner held weakly: no cycle through it
        self._patches.set(trainer, "save_checkpoint",
                          timed_aside(engine, CHECKPOINT, original(trainer, "save_checkpoint")))
        for callback in getattr(trainer, "checkpoint_callbacks", None) or []:
            if callable(getattr(callback, "_save_checkpoint", None)):
                self._patches.set(callback, "_save_checkpoint",
                                  timed_aside(engine, CHECKPOINT, original(callback, "_save_checkpoint")))

    def _unwrap(self) -> None:
        self._patches.restore()
        timing, self._callback_timing = self._callback_timing, None
        if timing is not None:
            timing.off()

    def _finish(self) -> None:
        self._hooks.remove()
        self._unwrap()
        self.engine.close()


def _steps_done(trainer: Trainer) -> int:
    """perfhooks' steps before this fit: batches that stepped an optimizer, from Lightning's loop state (restored
    from a checkpoint), which counts a GAN's batch once where ``global_step`` counts each optimizer's step."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    stepped = getattr(loop, "_batches_that_stepped", None)
    if not isinstance(stepped, int):
        return trainer.global_step
    return stepped + _step_lightning_adds_on_resume(loop)


def _step_lightning_adds_on_resume(loop: Any) -> int:
    """1 when Lightning will count, in ``epoch_loop.reset()`` (after ``on_train_start``), the step that a checkpoint
    saved in ``on_train_batch_end`` had not counted yet; else 0 (read as Lightning 2.6 does it);
    an older loop without them gives 0."""
    try:
        return int(bool(loop.restarting and not loop._should_accumulate()
                        and (loop.restarted_on_train_batch_end or not loop.restarted_on_last)))
    except AttributeError:
        return 0


def _wandb_source(trainer: Trainer) -> RunSource:
    """The run of the trainer's ``WandbLogger`` (its ``experiment``), on Lightning's step axis."""

    def find() -> object | None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                return logger.experiment
        return None

    every = getattr(trainer, "log_every_n_steps", None)
    return RunSource(find, WANDB_STEP_KEY, every if isinstance(every, int) and every > 0 else None)


# ----------------------------------------------------------------------------- perfhooks run
def instrument_constructions(module: Any, launcher: Any) -> Any:
    """For ``perfhooks run``: every ``Trainer`` built from now on gets a ``PerfCallback`` (with the launcher's
    settings) among its ``callbacks`` unless it has one already. Returns the undo."""

    def add_callback(kwargs: dict[str, Any]) -> dict[str, Any]:
        callbacks = kwargs.get("callbacks")
        listed = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        if not any(isinstance(callback, PerfCallback) for callback in listed):
            callback = PerfCallback(**launcher.settings)
            kwargs["callbacks"] = [*listed, callback]
            launcher.attached.append(callback)
        return kwargs

    return wrap_construction(module.Trainer, before=add_callback)
