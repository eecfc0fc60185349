"""torch hooks that feed the engine: optimizer step hooks, the training forward, per-module NVTX ranges; every
handle is kept so that a run removes exactly what it added.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from perfhooks.capture.nvtx import NvtxRanges
from perfhooks.timebase import monotonic_ns


def _never() -> bool:
    return False


#: ``torch.compiler.is_compiling``: True while dynamo traces (a constant it folds), False when code runs eagerly.
compiling = getattr(getattr(torch, "compiler", None), "is_compiling", _never)


def inert(*_args: Any) -> None:
    """A hook that does nothing: what a copy of a module perfhooks watches carries in place of its hook."""


def _inert() -> Callable[..., None]:
    return inert


class ModuleHook:
    """A hook perfhooks registers on a user's module: ``function``, and on the way out (pickle, deepcopy of the
    module) :func:`inert`, which holds nothing of the run (a module pickles its hooks with it)."""

    __slots__ = ("function",)

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)

    def __reduce__(self) -> tuple[Any, ...]:
        return _inert, ()


class HookHandles:
    """Holds torch hook handles; ``remove()`` is idempotent."""

    def __init__(self) -> None:
        self._handles: list[Any] = []

    def add(self, handle: Any) -> None:
        self._handles.append(handle)

    @property
    def active(self) -> bool:
        """Some hooks are registered through these handles now."""
        return bool(self._handles)

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


class HookSwitch:
    """Hooks that come off for light steps and go back on for detailed ones (torch's call of a module's forward
    hooks costs microseconds a step even when the hook returns at once). Each is registered through torch's own
    API and removed by its handle; ``remove()`` takes them off for good."""

    def __init__(self) -> None:
        self._hooks: list[tuple[Callable[..., Any], Callable[..., Any]]] = []
        self._handles: list[Any] = []
        #: The hooks are registered now.
        self.on = True

    def add(self, register: Callable[..., Any], hook: Callable[..., Any]) -> None:
        """``register(hook)`` now, and again each time the switch goes back on."""
        self._hooks.append((register, hook))
        if self.on:
            self._handles.append(register(hook))

    def switch(self, on: bool) -> None:
        if on == self.on:
            return
        self.on = on
        if on:
            self._handles = [register(hook) for register, hook in self._hooks]
        else:
            handles, self._handles = self._handles, []
            for handle in handles:
                handle.remove()

    def remove(self) -> None:
        self.switch(False)
        self._hooks = []


def watch_optimizer_steps(optimizers: Iterable[Any], on_after_step: Callable[..., None], handles: HookHandles,
                          on_before_step: Callable[..., None] | None = None, with_args: bool = False,
                          switch: HookSwitch | None = None) -> None:
    """Call ``on_after_step`` (and ``on_before_step``) around each ``optimizer.step()``, via torch's step hooks.

    Wrappers such as accelerate's ``AcceleratedOptimizer`` are unwrapped to the torch optimizer,
    whose hooks fire only when it really steps (not on accumulation micro-batches). An optimizer
    without torch's hook API is skipped: its phase then ends with the step. ``with_args``: the callbacks are
    registered as they are and get the hook's arguments (``optimizer, args, kwargs``), a frame fewer a step.
    ``switch``: the pre-step hook is registered through it (off on light steps).
    """
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        if not isinstance(inner, torch.optim.Optimizer):
            inner = optimizer
        register_post = getattr(inner, "register_step_post_hook", None)
        if register_post is not None:
            handles.add(register_post(on_after_step if with_args else _no_args(on_after_step)))
        register_pre = getattr(inner, "register_step_pre_hook", None)
        if on_before_step is not None and register_pre is not None:
            _register(register_pre, on_before_step if with_args else _no_args(on_before_step), handles, switch)


def _register(register: Callable[..., Any], hook: Callable[..., Any], handles: HookHandles,
              switch: HookSwitch | None) -> None:
    """``register(hook)``, kept in ``handles``, or in ``switch`` (which takes it off and puts it back); a module's
    hook goes in as a :class:`ModuleHook` (it pickles with the module)."""
    if isinstance(getattr(register, "__self__", None), torch.nn.Module):
        hook = ModuleHook(hook)
    if switch is not None:
        switch.add(register, hook)
    else:
        handles.add(register(hook))


def _no_args(callback: Callable[[], None]) -> Callable[..., None]:
    return lambda *_: callback()


class NoGate:
    """A gate that never closes: every step is detailed."""

    light = False
    dark_left = 0


def watch_training_forward(model: torch.nn.Module, on_start: Callable[..., None],
                           on_end: Callable[[], None] | None, handles: HookHandles, with_inputs: bool = False,
                           on_evaluation_forward: Callable[[float], None] | None = None, gate: Any = NoGate,
                           on_light_start: Callable[[torch.nn.Module, Any], None] | None = None,
                           switch: HookSwitch | None = None) -> None:
    """Call ``on_start``/``on_end`` around the model's training forward passes (``on_start(args)``, the forward's
    positional arguments, with ``with_inputs``).

    Only forwards on the thread that registered the hooks, in training mode, with grad enabled
    and outside a backward pass count: evaluation and activation-checkpoint recomputation (which
    runs inside backward, possibly on autograd's threads) are ignored.

    Register them on the outermost module the loop calls (a ``torch.compile`` wrapper runs its own hooks
    eagerly). A hook that ends up inside a compiled region does nothing there: its first statement is
    ``torch.compiler.is_compiling()``, which dynamo folds to True, so it adds no graph break and no error under
    ``fullgraph=True`` (and then it does not fire: the caller must get its event elsewhere).

    ``gate``: while ``gate.light`` (a light step, :mod:`~perfhooks.runtime.step.sampling`), the hooks do nothing after
    that first check but call ``on_light_start(module, args)`` at a forward's start. ``switch``: the hooks are
    registered through it, so that a loop can take them off for its light steps.
    """
    import threading

    training_thread = threading.get_ident()
    #: Start times (ns) of evaluation forwards in progress: eval mode or no grad, on the training thread, outside
    #: a backward (``on_evaluation_forward(ms)`` gets each one's host time).
    evaluating: list[int] = []

    get_ident, grad_enabled, graph_task = threading.get_ident, torch.is_grad_enabled, torch._C._current_graph_task_id

    def evaluation_forward(module: torch.nn.Module) -> bool:
        return (on_evaluation_forward is not None and not (module.training and grad_enabled())
                and get_ident() == training_thread and graph_task() == -1)

    def pre(module: torch.nn.Module, args: Any) -> None:
        if compiling():
            return
        if gate.light:
            if on_light_start is not None:
                on_light_start(module, args)
            return
        if module.training and grad_enabled() and get_ident() == training_thread and graph_task() == -1:
            if with_inputs:
                on_start(args)
            else:
                on_start()
        elif evaluation_forward(module):
            evaluating.append(monotonic_ns())

    _register(model.register_forward_pre_hook, pre, handles, switch)
    if on_end is not None or on_evaluation_forward is not None:
        def post(module: torch.nn.Module, _args: Any, _output: Any) -> None:
            if compiling() or gate.light:
                return
            if module.training and grad_enabled() and get_ident() == training_thread and graph_task() == -1:
                if on_end is not None:
                    on_end()
            elif evaluating and evaluation_forward(module):
                on_evaluation_forward((monotonic_ns() - evaluating.pop()) / 1e6)  # type: ignore[misc]

        _register(model.register_forward_hook, post, handles, switch)


def watch_evaluation_forwards(models: Iterable[torch.nn.Module], on_forward: Callable[[torch.nn.Module], None],
                              handles: HookHandles) -> None:
    """``on_forward(module)`` at each forward of ``models`` until ``handles`` are removed (an evaluation's probe:
    registered when an evaluation opens, off at the first forward after it; never in a compiled region)."""
    def pre(module: torch.nn.Module, _args: Any) -> None:
        if not compiling():
            on_forward(module)

    for model in models:
        handles.add(model.register_forward_pre_hook(ModuleHook(pre)))


def add_module_ranges(model: torch.nn.Module, ranges: NvtxRanges, handles: HookHandles) -> None:
    """An NVTX range around every submodule's forward, named by its qualified name."""
    if not ranges.active:
        return
    for name, module in model.named_modules():
        label = name or type(model).__name__

        def pre(_module: Any, _args: Any, label: str = label) -> None:
            if compiling():  # inside a compiled region no range can exist: nothing is traced
                return
            ranges.push(label)

        def post(_module: Any, _args: Any, _output: Any) -> None:
            if compiling():
                return
            ranges.pop()

        handles.add(module.register_forward_pre_hook(ModuleHook(pre)))
        handles.add(module.register_forward_hook(ModuleHook(post), always_call=True))
