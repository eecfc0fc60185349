"""``perfhooks.profile``: a hand-written PyTorch loop (nanoGPT's ``train.py``) with no framework, in a few lines.

The phases come from torch's own hooks where the loop has them, and from the loop where it has none:

- ``forward``: the model's forward pre-hook (training forwards only: not evaluation, not activation-checkpoint
  recomputation); the first forward after a fetch counts its first input as the batch (samples, tokens);
- ``backward``: from the end of the model's forward to the optimizer step (the loss, ``loss.backward()``, gradient
  clipping, a ``GradScaler``'s unscale);
- ``optimizer``: the optimizer's step pre- and post-hooks (``register_step_pre_hook``); the step that stepped ends
  at the next batch's fetch or forward;
- ``data_wait``: ``with perf.data_wait(): x, y = get_batch("train")``, or ``for batch in perf.batches(loader)``; a
  fetch inside a step (nanoGPT fetches the next batch between a micro-step's forward and backward) pauses the phase
  it interrupts; from the end of a fetch to the model's forward is ``other``;
- evaluation and checkpoints: ``with perf.evaluation():`` and ``with perf.checkpoint():``, taken out of the steps.

Nothing of the loop is patched: hooks only, removed at ``close()``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from perfhooks.config import DEFAULT_OUTPUT_FOLDER, PerfConfig
from perfhooks.events import BACKWARD, CHECKPOINT, DATA_WAIT, EVALUATION, EVALUATION_FORWARDS, FORWARD, OPTIMIZER
from perfhooks.runtime.engine import Engine, NullEngine
from perfhooks.runtime.hooks.torch_hooks import (
    HookHandles,
    HookSwitch,
    NoGate,
    watch_optimizer_steps,
    watch_training_forward,
)
from perfhooks.runtime.loops.session import LoopSession, check_models_and_optimizers, listed
from perfhooks.runtime.step.tracker import DarkFetches
from perfhooks.runtime.throughput.precision import autocast_dtype, autocast_probe
from perfhooks.timebase import monotonic_ns

#: Settings the launcher gives every ``perfhooks.profile`` in this process (``perfhooks run --output-dir ...``):
#: defaults under the call's own arguments; ``_forced`` over them (a ``perfhooks tune`` trial's output folder, so
#: that a trial never writes over the user's own report).
_launched: dict[str, Any] = {}
_forced: dict[str, Any] = {}


def launched_settings(defaults: dict[str, Any], forced: dict[str, Any] | None = None) -> Callable[[], None]:
    """Set the launcher's settings for the plain loops this process profiles; returns the undo."""
    _launched.clear()
    _launched.update(defaults)
    _forced.clear()
    _forced.update(forced or {})

    def undo() -> None:
        _launched.clear()
        _forced.clear()

    return undo


def profile(model: torch.nn.Module | None = None, optimizer: Any = None, *,
            output_dir: str | os.PathLike[str] | None = None, **settings: Any) -> ProfiledLoop:
    """Profile a hand-written training loop; use as a context manager (or call ``close()``).

    Args:
        model: the module the loop calls for its forward (a ``torch.compile`` wrapper is fine), or a list of them.
        optimizer: the optimizer(s) the loop steps; a step ends after each ``optimizer.step()``. ``None``: call
            ``perf.step()`` at the end of each step instead.
        output_dir: where ``report.json``, ``report.html`` and ``traces/`` go; default ``./perfhooks``.
        **settings: any :class:`perfhooks.PerfConfig` field (``schedule``, ``max_traces``, ``wandb``, ...).

    Example::

        with perfhooks.profile(model, optimizer) as perf:
            for step in range(max_iters):
                with perf.data_wait():
                    x, y = get_batch("train")
                loss = model(x, y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    """
    given = {"output_dir": output_dir, **settings} if output_dir is not None else dict(settings)
    config = PerfConfig.from_kwargs("profile", {**_launched, **given, **_forced})
    models, optimizers = listed(model), listed(optimizer)
    check_models_and_optimizers("profile", models, optimizers)
    return ProfiledLoop(models, optimizers, config)


def _device_of(models: list[torch.nn.Module]) -> torch.device | None:
    for model in models:
        for parameter in model.parameters():
            return parameter.device
    return None


#: Detailed steps whose optimizer stepped with no training forward of the modules given, before perfhooks says that
#: the loop calls another module.
NO_FORWARD_STEPS = 3

class DataWait:
    """``with perf.data_wait():`` a fetch (a plain object, made once and entered once a step: it costs less than a
    generator's context manager; a nested fetch gets one of its own). A fetch inside a step (nanoGPT prefetches the
    next batch between forward and backward) pauses the open phase; one at a step's start ends the step that
    stepped."""

    __slots__ = ("loop", "resume", "timed")

    def __init__(self, loop: ProfiledLoop) -> None:
        self.loop = loop
        self.resume: str | None = None
        self.timed = False

    def __enter__(self) -> None:
        loop = self.loop
        fast = loop._fast
        if fast.left > 1 and fast.stepped and fast.open:  # a dark step ends: counted here, the tracker left cold
            fast.left -= 1
            fast.steps += 1
            fast.stepped = False
            return
        if loop._closed:
            return
        self.timed = True
        self.resume = None if loop._stepped else loop.engine.open_phase
        loop._stepped = False
        loop.engine.fetch()  # ends the step that stepped, opens data_wait
        gate = loop._gate
        if gate.dark_left:  # a dark step: its wait is not timed, and the exit returns at once
            self.timed = False
        elif gate.light is loop._switch.on and loop._switching:  # the step's kind changed: its hooks follow
            loop._follow_step_kind()

    def __exit__(self, *exc_info: object) -> None:
        if not self.timed:
            return
        self.timed = False
        loop = self.loop
        loop._unseen_batch = True
        loop.engine.phase_end(DATA_WAIT)
        if self.resume in (FORWARD, BACKWARD):
            loop.engine.phase_start(self.resume)


class ProfiledLoop(LoopSession):
    """The hooks :func:`profile` added; ``close()`` (idempotent) removes them and writes the report."""

    def __init__(self, models: list[torch.nn.Module], optimizers: list[Any], config: PerfConfig) -> None:
        self._hooks = HookHandles()
        #: The forward's hooks and the optimizer's pre-step hook: off for a light step once the loop fetches
        #: through :meth:`data_wait` (its fetch then ends each step), on for a detailed one.
        self._switch = HookSwitch()
        self._switching = True
        self._stepped = False
        self._unseen_batch = False  # a fetch whose batch no forward has taken yet (its samples and tokens count)
        self._closed = False
        self._wait = DataWait(self)
        #: The tracker's fast path through dark blocks (a closed one until the engine starts).
        self._fast = DarkFetches()
        self._models = models
        #: A training forward of the modules given has run; detailed steps that stepped without one so far.
        self._forward_seen = False
        self._no_forward_steps = 0
        device = _device_of(models)
        self._device_type = device.type if device is not None else "cpu"
        #: Until autocast was seen on at a forward: the check (a C call), else None.
        self._autocast_on = autocast_probe(self._device_type)
        output_dir = config.output_dir or DEFAULT_OUTPUT_FOLDER
        self.engine: Engine | NullEngine = Engine.start(config, output_dir, framework="pytorch",
                                                        device=_device_of(models))
        if not self.engine.active:
            self._closed = True
            return
        #: ``gate.light``: the open step is light, and the hooks return at their first check.
        self._gate: Any = getattr(self.engine, "tracker", NoGate)
        if self._gate is not NoGate:  # the tracker: this loop takes its fast path through dark blocks
            self._fast = self._gate.fast
            self._gate.fast_path = True
        try:
            for model in models:
                watch_training_forward(model, self._forward_start, self._forward_end, self._hooks, with_inputs=True,
                                       on_evaluation_forward=self._evaluation_forward, gate=self._gate,
                                       on_light_start=self._light_forward_start, switch=self._switch)
                self.engine.watch_model(model)
            for optimizer in optimizers:
                self.engine.watch_optimizer(optimizer)
            watch_optimizer_steps(optimizers, self._optimizer_end, self._hooks, on_before_step=self._optimizer_start,
                                  with_args=True, switch=self._switch)
        except Exception as error:  # never into the user's loop: unwire, warn once, run unwatched
            self._detach()
            self.engine.faults.report("profile", error)
            self.engine = NullEngine()
            self._closed = True

    # --------------------------------------------------------------- events from torch's hooks
    def _forward_start(self, inputs: tuple[Any, ...]) -> None:
        self._forward_seen = True
        engine = self.engine
        if self._stepped:
            self._stepped = False
            engine.step_end()
        engine.phase_start(FORWARD)
        if self._gate.light:  # the step that opened is light: no batch count, no dtype
            return
        autocast_on = self._autocast_on
        if autocast_on is not None and autocast_on():  # the dtype the step's matmuls run in, once seen
            dtype = autocast_dtype(self._device_type)
            if dtype is not None:
                self._autocast_on = None
                engine.note_precision(dtype, f"torch.autocast({self._device_type!r}, dtype={dtype}) at the "
                                      "model's forward", ran=True)
        if self._unseen_batch and inputs:  # the first forward after a fetch: its first input is the batch
            self._unseen_batch = False
            engine.batch(inputs[0])

    def _light_forward_start(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """A forward's start in a light step: only a loop that does not fetch ends its stepped step here."""
        if self._stepped and module.training and torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
            self._forward_start(args)

    def _follow_step_kind(self) -> None:
        """The hooks off for a light step, back on for a detailed one. A compiled model keeps them (whether a
        compiled region sees its module's hooks is dynamo's to guard, not perfhooks' to change)."""
        started = monotonic_ns()
        light = self._gate.light
        try:
            if light:
                compile = self.engine.compile  # type: ignore[union-attr]
                if compile.model_compiled or compile.compiled_in_run():
                    self._switching = False
                    return
            self._switch.switch(not light)
        except Exception as error:  # the hooks stay as they are (gated) from here on
            self._switching = False
            self.engine.faults.report("hook_switch", error)
        self._gate.add_own_time(monotonic_ns() - started)  # the gate is the tracker

    def _forward_end(self) -> None:
        self.engine.phase_start(BACKWARD)

    def _evaluation_forward(self, ms: float) -> None:
        """A forward in eval mode or under no_grad took ``ms`` (host): inside a step, a validation the loop did
        not mark (named work; nothing inside ``perf.evaluation()``, which is an aside)."""
        self.engine.named(EVALUATION_FORWARDS, ms)

    def _optimizer_start(self, *_hook_args: Any) -> None:
        if not self._gate.light:
            self.engine.phase_start(OPTIMIZER)

    def _optimizer_end(self, *_hook_args: Any) -> None:
        fast = self._fast
        if fast.left:  # a dark step stepped: noted on the fast path's object
            fast.stepped = True
            fast.hooks += 1
            return
        engine = self.engine
        if not self._gate.light:
            engine.phase_end(OPTIMIZER)
            if not self._forward_seen:
                self._no_forward_steps += 1
                if self._no_forward_steps == NO_FORWARD_STEPS:
                    self._say_module_not_called()
        engine.stepped()
        self._stepped = True

    def _say_module_not_called(self) -> None:
        """The optimizer stepped :data:`NO_FORWARD_STEPS` detailed steps with no training forward of the modules
        given: the loop calls another module (most often a ``torch.compile`` wrapper of the one given). Said once;
        the report names it, and no verdict is drawn from phases that were never seen."""
        names = ", ".join(sorted({type(model).__name__ for model in self._models}))
        message = (f"the optimizer stepped {NO_FORWARD_STEPS} times but the module given to perfhooks.profile "
                   f"({names}) never ran a training forward: the loop calls another module, most often its "
                   "torch.compile wrapper (compiled = torch.compile(model)). Pass the one the loop calls: "
                   "perfhooks.profile(compiled, optimizer)")
        engine = self.engine
        engine.once.warn("module_not_called", message)  # type: ignore[union-attr]
        engine.parts.module_not_called = message  # type: ignore[union-attr]

    # --------------------------------------------------------------- what the loop says
    def data_wait(self) -> DataWait:
        """Around the loop's fetch of a training batch (``get_batch``, ``next(iterator)``)."""
        wait = self._wait
        return DataWait(self) if wait.timed else wait

    def batches(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """The batches of ``iterable``, each fetch timed as ``data_wait``; the last step ends with the data."""
        iterator = iter(iterable)
        while True:
            with self.data_wait():
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
            self._unseen_batch = False
            self.engine.batch(batch)
            yield batch
        self.engine.idle()

    def step(self) -> None:
        """End the step now (a loop with no optimizer given to :func:`profile`, or one whose steps a
        ``GradScaler`` skipped)."""
        self._stepped = False
        self.engine.stepped()
        self.engine.step_end()

    @contextmanager
    def evaluation(self) -> Iterator[None]:
        """Around an evaluation: its time is taken out of the steps and reported apart."""
        with self._aside(EVALUATION):
            yield

    @contextmanager
    def checkpoint(self) -> Iterator[None]:
        """Around a checkpoint write: its time is taken out of the steps and reported apart."""
        with self._aside(CHECKPOINT):
            yield

    @contextmanager
    def _aside(self, kind: str) -> Iterator[None]:
        self.engine.aside_start(kind)
        try:
            yield
        finally:
            self.engine.aside_end(kind)

    # --------------------------------------------------------------- end
    def _detach(self) -> None:
        self._hooks.remove()
        self._switch.remove()
