"""accelerate: one call wires a hand-written loop.

    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    perf = attach(accelerator, output_dir="runs/perf")   # everything the accelerator prepared
    for batch in dataloader:
        with accelerator.accumulate(model):
            loss = loss_fn(model(batch))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    perf.close()                                          # or: with attach(...) as perf: ...

Where the events come from:

=======================================  ==========================================
the loop                                 engine
=======================================  ==========================================
``next()`` on a prepared dataloader      ``fetch()`` (a step that stepped ends here) on a training
                                         loader; otherwise the loop is evaluating:
                                         ``aside("evaluation")`` until the loader runs out
model forward pre-hook (each model)      ``phase_start("forward")``; the forward phase includes the loss
``accelerator.backward`` (wrapped)       ``phase_start("backward")`` ... ``phase_end("backward")``
``optimizer.step()`` (wrapped, each)     ``phase_start("optimizer")`` ... ``phase_end("optimizer")``;
                                         when accelerate synchronized gradients: ``stepped()``
``accelerator.save_state`` (wrapped)     ``aside("checkpoint")``
``accelerator.end_training`` (wrapped)   ``close()`` before the trackers end (W&B gets the run's end)
``accelerator.skip_first_batches``       the loader it returns is timed like the one it came from
end of the training loader, ``close()``  ``idle()``; the last step ends
``accelerator.profile()`` (wrapped)      capture windows step aside for the user's profiler
=======================================  ==========================================

A loader is a training loader once a backward or an optimizer step ran while it was being
iterated; until then (its first batch) it is one when a watched model is in training mode with
grad enabled. Fine-tuning with the model in ``eval()`` mode (dropout or BatchNorm frozen) is
training all the same: its first batch, taken for evaluation, is handed back at its backward.

A step ends when accelerate says gradients were synchronized (``sync_gradients``) at an
``optimizer.step()`` call: ``accelerator.accumulate`` adds micro-batches, never steps; two
optimizers stepped in one iteration make one step; a step that GradScaler skipped after an
fp16 overflow still ends, and so does one under DeepSpeed, whose optimizer wrapper's ``step``
does nothing (the real step runs inside ``accelerator.backward``). The optimizer phase covers
``AcceleratedOptimizer.step`` as the user calls it. Each dataloader stays the same object: its
class is swapped for a subclass whose ``__iter__`` times ``next()``; methods are wrapped on the
instances; ``close()`` restores all of it. A fault while wiring is one warning and the loop runs
unwatched: ``attach`` never raises into the user's loop (bad arguments still get a ``TypeError``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from perfhooks.config import DEFAULT_OUTPUT_FOLDER, PerfConfig
from perfhooks.events import BACKWARD, CHECKPOINT, DATA_WAIT, EVALUATION, FORWARD, OPTIMIZER
from perfhooks.faults import FaultLog
from perfhooks.integrations.recipe import accelerate_recipe
from perfhooks.integrations.versions import note_versions
from perfhooks.runtime.engine import Engine, NullEngine, RunEngine
from perfhooks.runtime.hooks.patches import InstancePatches, noting_errors, timed_aside, wrap_construction
from perfhooks.runtime.hooks.torch_hooks import HookHandles, watch_training_forward
from perfhooks.runtime.loops.session import LoopSession, check_models_and_optimizers, listed
from perfhooks.runtime.throughput.precision import matmul_dtype
from perfhooks.sinks.wandb import RunSource


def attach(accelerator: Any, model: Any = None, optimizer: Any = None, dataloader: Any = None,
           output_dir: str | os.PathLike[str] | None = None, **settings: Any) -> PerfSession:
    """Profile a hand-written accelerate loop; returns a session to ``close()`` (or use as a context manager).

    Args:
        accelerator: the ``accelerate.Accelerator`` of the loop.
        model: what ``accelerator.prepare`` returned for the model(s), one object or a list; ``None`` (the
            default) watches every model the accelerator has prepared so far.
        optimizer: the prepared optimizer(s), likewise; ``None`` watches every one prepared so far.
        dataloader: the prepared dataloader(s), likewise; ``None`` watches every one prepared so far.
        output_dir: where ``report.json`` and ``traces/`` go; default ``<accelerator.logging_dir>/perfhooks_out``
            (accelerate's folder for logs, which is ``project_dir`` unless set apart from it), else
            ``./perfhooks_out``.
        **settings: any :class:`perfhooks.PerfConfig` field (``schedule``, ``max_traces``, ...).
    """
    config = PerfConfig.from_kwargs("attach", {"output_dir": output_dir, **settings})
    if not callable(getattr(accelerator, "backward", None)) or not hasattr(accelerator, "gradient_state"):
        raise TypeError(f"attach() accelerator must be an accelerate.Accelerator, got {type(accelerator).__name__}")
    models = listed(model, getattr(accelerator, "_models", []))
    optimizers = listed(optimizer, getattr(accelerator, "_optimizers", []))
    dataloaders = listed(dataloader, getattr(accelerator, "_dataloaders", []))
    check_models_and_optimizers("attach", models, optimizers)
    for loader in dataloaders:
        if not hasattr(type(loader), "__iter__"):
            raise TypeError(f"attach() dataloader must be iterable, got {type(loader).__name__}")
    return PerfSession(accelerator, models, optimizers, dataloaders, config)


def _logging_dir(accelerator: Any) -> str | None:
    """accelerate's folder for logs (``ProjectConfiguration.logging_dir``, its ``project_dir`` unless the job set
    it apart), where a report is not cleared with the checkpoints; ``None`` when the job set neither."""
    for name in ("logging_dir", "project_dir"):
        try:
            folder = getattr(accelerator, name, None)
        except Exception:  # a property of an older or newer accelerate that fails: the next name
            folder = None
        if isinstance(folder, (str, os.PathLike)) and str(folder):
            return os.fspath(folder)
    return None


def _as_base(base: type) -> Callable[..., Any]:
    """A swapped loader's ``__reduce_ex__``: it pickles and copies as its own class would (the subclass perfhooks
    made for the run is a local class, and holds the run)."""

    def __reduce_ex__(instance: Any, protocol: int) -> Any:
        swapped = type(instance)
        _set_class(instance, base)
        try:
            return instance.__reduce_ex__(protocol)
        finally:
            _set_class(instance, swapped)

    return __reduce_ex__


def _set_class(instance: Any, cls: type) -> None:
    """Assign ``instance.__class__`` through ``object``'s own descriptor.

    accelerate's ``DataLoaderShard`` overrides ``__class__`` with a read-only property (so that
    it passes ``isinstance`` checks as the DataLoader it wraps); the subclass keeps that property.
    """
    object.__dict__["__class__"].__set__(instance, cls)


def _none() -> None:
    return None


def _wandb_tracker_run(accelerator: Any) -> Any | None:
    """The run of the accelerator's W&B tracker (``log_with="wandb"``), once ``init_trackers`` made it."""
    for tracker in getattr(accelerator, "trackers", None) or []:
        if getattr(tracker, "name", None) == "wandb":
            return tracker.run
    return None


class PerfSession(LoopSession):
    """The wiring ``attach`` made; ``close()`` (idempotent) unwires it and writes the report.

    The session holds the Accelerator, the loader in hand and the swapped loaders weakly: an Accelerator the
    program drops is freed at once, as plain, and its run then closes itself (the engine's owner watch)."""

    @property
    def accelerator(self) -> Any:
        """The Accelerator, while it lives (None once it was freed or the session closed)."""
        return self._accelerator()

    @accelerator.setter
    def accelerator(self, value: Any) -> None:
        self._accelerator: Callable[[], Any] = weakref.ref(value) if value is not None else _none

    @property
    def _iterating(self) -> Any:
        return self._iterating_ref()

    @_iterating.setter
    def _iterating(self, value: Any) -> None:
        self._iterating_ref: Callable[[], Any] = weakref.ref(value) if value is not None else _none

    def __init__(self, accelerator: Any, models: list[Any], optimizers: list[Any], dataloaders: list[Any],
                 config: PerfConfig) -> None:
        self.accelerator = accelerator  # held weakly (the property below)
        self.models = models
        self._hooks = HookHandles()
        self._patches = InstancePatches()
        self._swapped: list[tuple[Any, type]] = []
        self._optimizers: list[Any] = []
        self._closed = False
        #: Loaders a backward or optimizer step ran under (``id``s: a loader may not be hashable).
        self._training_loaders: set[int] = set()
        self._iterating: Any = None  # the loader whose batch is in hand now
        output_dir = config.output_dir or os.path.join(_logging_dir(accelerator) or ".", DEFAULT_OUTPUT_FOLDER)
        held = weakref.ref(accelerator)
        self.engine = Engine.start(config, output_dir, framework="accelerate", device=accelerator.device,
                                   wandb_source=RunSource(lambda: _wandb_tracker_run(held())))
        note_versions(self.engine, "accelerate")
        if not self.engine.active:
            self._closed = True
            return
        self.engine.owner.follow(accelerator, "Accelerator")  # a run whose Accelerator was freed closes itself
        try:
            self._wire(optimizers, dataloaders)
        except Exception as error:  # never into the user's loop: unwire, warn once, run unwatched
            self._unwire()
            self.engine.faults.report("attach", error)
            self.engine = NullEngine()
            self._closed = True

    def _wire(self, optimizers: list[Any], dataloaders: list[Any]) -> None:
        engine = self.engine
        if getattr(self.accelerator, "profile_handler", None) is not None:
            engine.defer_windows_to("accelerate's ProfileKwargs")
        dtype = matmul_dtype(getattr(self.accelerator, "mixed_precision", None))
        if dtype is not None:
            engine.note_precision(dtype, f"Accelerator(mixed_precision={self.accelerator.mixed_precision!r})")
        models, self.models = self.models, []
        accelerator = self.accelerator
        engine.note_recipe(lambda: accelerate_recipe(accelerator, models))
        self._watch(models, optimizers, dataloaders)
        self._wrap_method("backward", self._timed_backward)
        self._wrap_method("save_state", self._timed_save_state)
        self._wrap_method("skip_first_batches", self._timed_skip)
        self._wrap_method("profile", self._deferring_profile)
        self._wrap_method("end_training", self._closing_before_trackers)

    def _watch(self, models: list[Any], optimizers: list[Any], dataloaders: list[Any]) -> None:
        """Wire objects not watched yet (each once)."""
        for model in models:
            if not any(model is watched for watched in self.models):
                watch_training_forward(model, self._forward_start, None, self._hooks)
                self.engine.watch_model(model)
                self.models.append(model)
        for optimizer in optimizers:
            if not any(optimizer is watched for watched in self._optimizers):
                self._wrap_optimizer(optimizer)
                self._optimizers.append(optimizer)
        for loader in dataloaders:
            self._wrap_dataloader(loader)

    def watch_prepared(self) -> None:
        """Also watch what the accelerator prepared since ``attach`` (models, optimizers, dataloaders)."""
        if self._closed:
            return
        accelerator = self.accelerator
        try:
            self._watch(list(getattr(accelerator, "_models", [])), list(getattr(accelerator, "_optimizers", [])),
                        list(getattr(accelerator, "_dataloaders", [])))
        except Exception as error:  # never into the user's loop
            self.engine.faults.report("attach", error)

    # --------------------------------------------------------------- copies
    def __getstate__(self) -> dict[str, Any]:
        """A copy of a session (pickle, deepcopy) is a closed one: it never carries a run or the loop's objects."""
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.accelerator = None
        self.models = []
        self._hooks = HookHandles()
        self._patches = InstancePatches()
        self._swapped = []
        self._optimizers = []
        self._training_loaders = set()
        self._iterating = None
        self._closed = True
        self.engine: RunEngine = NullEngine()

    # --------------------------------------------------------------- events
    def _forward_start(self) -> None:
        self.engine.phase_start(FORWARD)

    def _training(self, loader: Any) -> bool:
        """A fetch for training: a backward or an optimizer step ran under this loader before, or (its first
        batch) a watched model is in training mode and grad is on. Otherwise: evaluation."""
        if id(loader) in self._training_loaders:
            return True
        return torch.is_grad_enabled() and any(model.training for model in self.models)

    def _trains(self) -> None:
        """A backward or an optimizer step: the loader in hand is a training loader. Its batch, taken for
        evaluation (the model in ``eval()`` mode), was training: that evaluation is handed back."""
        loader = self._iterating
        if loader is None or id(loader) in self._training_loaders:
            return
        self._training_loaders.add(id(loader))
        if self.engine.account.innermost == EVALUATION:
            self.engine.aside_cancel(EVALUATION)

    def _before_next(self, loader: Any) -> None:
        engine = self.engine
        self._iterating = loader
        if self._training(loader):
            if engine.account.innermost == EVALUATION:
                engine.aside_end(EVALUATION)
            engine.fetch()
        elif engine.account.innermost != EVALUATION:
            engine.idle()
            engine.aside_start(EVALUATION)

    def _after_next(self, batch: Any) -> None:
        """A training batch is in hand (a prepared loader has placed it on the device): the forward starts. The
        model's forward hook says the same in eager mode; a compiled model's hooks can't."""
        if self.engine.open_phase == DATA_WAIT:
            self.engine.phase_start(FORWARD)
            self.engine.batch(batch)

    def _exhausted(self) -> None:
        engine = self.engine
        self._iterating = None
        if engine.account.innermost == EVALUATION:
            engine.aside_end(EVALUATION)
        else:
            engine.idle()

    # --------------------------------------------------------------- wrappers
    def _wrap_method(self, name: str, make: Any) -> None:
        accelerator = self.accelerator
        if callable(getattr(accelerator, name, None)):
            self._patches.set(accelerator, name, make(self._patches.original(accelerator, name)))

    def _wrap_optimizer(self, optimizer: Any) -> None:
        engine = self.engine
        engine.watch_optimizer(optimizer)
        original = self._patches.original(optimizer, "step")
        gradient_state = getattr(optimizer, "gradient_state", None) or self.accelerator.gradient_state

        def step(*args: Any, **kwargs: Any) -> Any:
            self._trains()
            if not gradient_state.sync_gradients:  # an accumulation micro-batch: accelerate skips the step
                return original(*args, **kwargs)
            engine.phase_start(OPTIMIZER)
            try:
                result = original(*args, **kwargs)
            finally:
                engine.phase_end(OPTIMIZER)
            # only a step that returned counts (one that raised took no step); a step GradScaler skipped on an
            # overflow counts, as Lightning's and transformers' global step count it
            engine.stepped()
            return result

        self._patches.set(optimizer, "step", noting_errors(engine, step))

    def _timed_backward(self, original: Any) -> Any:
        engine = self.engine

        def backward(loss: Any, **kwargs: Any) -> Any:
            self._trains()
            engine.phase_start(BACKWARD)
            try:
                return original(loss, **kwargs)
            finally:
                engine.phase_end(BACKWARD)

        return noting_errors(engine, backward)

    def _timed_save_state(self, original: Any) -> Any:
        return timed_aside(self.engine, CHECKPOINT, original)

    def _timed_skip(self, original: Any) -> Any:
        def skip_first_batches(*args: Any, **kwargs: Any) -> Any:
            loader = original(*args, **kwargs)
            if not self._closed:
                try:
                    self._wrap_dataloader(loader)
                except Exception as error:
                    self.engine.faults.report("attach", error)
            return loader

        return skip_first_batches

    def _closing_before_trackers(self, original: Any) -> Any:
        def end_training(*args: Any, **kwargs: Any) -> Any:
            self.close()  # the report, the table and W&B's last rows while the trackers are still open
            return original(*args, **kwargs)

        return end_training

    def _deferring_profile(self, original: Any) -> Any:
        engine = self.engine

        @contextlib.contextmanager
        def profile(*args: Any, **kwargs: Any) -> Iterator[Any]:
            engine.defer_windows_to("accelerator.profile()")
            with original(*args, **kwargs) as profiler:
                yield profiler

        return profile

    def _wrap_dataloader(self, loader: Any) -> None:
        if any(loader is swapped() for swapped, _ in self._swapped):
            return
        session = self
        base = type(loader)

        def __iter__(instance: Any) -> Iterator[Any]:
            iterator = base.__iter__(instance)
            while True:
                if not session._closed:
                    session._before_next(instance)
                try:
                    batch = next(iterator)
                except StopIteration:
                    if not session._closed:
                        session._exhausted()
                    return
                except BaseException as error:
                    if not session._closed:
                        session.engine.note_error(error)
                    raise
                if not session._closed:
                    session._after_next(batch)
                yield batch

        _set_class(loader, type(base.__name__, (base,), {"__iter__": __iter__, "__module__": base.__module__,
                                                         "__reduce_ex__": _as_base(base)}))
        self._swapped.append((weakref.ref(loader), base))

    def _unwire(self) -> None:
        self._hooks.remove()
        self._patches.restore()
        swapped, self._swapped = self._swapped, []
        for reference, base in swapped:
            loader = reference()
            if loader is not None:
                _set_class(loader, base)

    # --------------------------------------------------------------- end
    def _detach(self) -> None:
        try:
            self._unwire()
        finally:  # the session keeps none of the loop's objects
            self.accelerator, self.models, self._optimizers, self._iterating = None, [], [], None


# ----------------------------------------------------------------------------- perfhooks run
def _built_by_transformers() -> bool:
    """Whether the Accelerator being built is a transformers Trainer's own (that Trainer has its callback)."""
    frame = sys._getframe(2)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("transformers."):
            return True
        frame = frame.f_back
    return False


def instrument_constructions(module: Any, launcher: Any) -> Callable[[], None]:
    """For ``perfhooks run``: every ``Accelerator`` built from now on is attached at its first ``prepare``
    and watches what later ``prepare`` calls return; its session closes when the script ends. Returns the undo."""
    prepare_patches = InstancePatches()

    def follow(accelerator: Any) -> None:
        if not _built_by_transformers():  # a transformers Trainer's own: that Trainer has its callback
            _follow_prepare(accelerator, launcher, prepare_patches)

    restore_init = wrap_construction(module.Accelerator, after=follow)

    def undo() -> None:
        restore_init()
        prepare_patches.restore()

    return undo


def _follow_prepare(accelerator: Any, launcher: Any, patches: InstancePatches) -> None:
    original = accelerator.prepare
    session: list[PerfSession] = []

    def prepare(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            if not session:
                session.append(attach(accelerator, **launcher.settings))
                launcher.attached.append(session[0])
                launcher.closers.append(lambda error: _close(session[0], error))
            else:
                session[0].watch_prepared()
        except Exception as error:  # never into the user's script
            FaultLog().report("perfhooks run", error)
        return result

    patches.set(accelerator, "prepare", prepare)


def _close(session: PerfSession, error: BaseException | None) -> None:
    if error is not None and not session._closed:
        session.engine.exception(error)
    session.close()
