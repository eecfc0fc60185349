"""Torch hooks every integration needs, registered through torch's own APIs (no monkeypatching)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from perfhooks.annotate import NvtxRanges


class HookHandles:
    """Holds torch hook handles; ``remove()`` is idempotent."""

    def __init__(self) -> None:
        self._handles: list[Any] = []

    def add(self, handle: Any) -> None:
        self._handles.append(handle)

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


def watch_optimizer_steps(optimizers: Iterable[Any], on_after_step: Callable[[], None], handles: HookHandles,
                          on_before_step: Callable[[], None] | None = None) -> None:
    """Call ``on_after_step`` (and ``on_before_step``) around each ``optimizer.step()``, via torch's step hooks.

    Wrappers such as accelerate's ``AcceleratedOptimizer`` are unwrapped to the torch optimizer,
    whose hooks fire only when it really steps (not on accumulation micro-batches). An optimizer
    without torch's hook API is skipped: its phase then ends with the step.
    """
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        if not isinstance(inner, torch.optim.Optimizer):
            inner = optimizer
        register_post = getattr(inner, "register_step_post_hook", None)
        if register_post is not None:
            handles.add(register_post(lambda *_: on_after_step()))
        register_pre = getattr(inner, "register_step_pre_hook", None)
        if on_before_step is not None and register_pre is not None:
            handles.add(register_pre(lambda *_: on_before_step()))


def watch_training_forward(model: torch.nn.Module, on_start: Callable[[], None],
                           on_end: Callable[[], None] | None, handles: HookHandles) -> None:
    """Call ``on_start``/``on_end`` around the model's training forward passes.

    Only forwards on the thread that registered the hooks, in training mode, with grad enabled
    and outside a backward pass count: evaluation and activation-checkpoint recomputation (which
    runs inside backward, possibly on autograd's threads) are ignored.
    """
    import threading

    training_thread = threading.get_ident()

    def training_forward(module: torch.nn.Module) -> bool:
        return (module.training and torch.is_grad_enabled() and threading.get_ident() == training_thread
                and torch._C._current_graph_task_id() == -1)

    def pre(module: torch.nn.Module, _args: Any) -> None:
        if training_forward(module):
            on_start()

    handles.add(model.register_forward_pre_hook(pre))
    if on_end is not None:
        def post(module: torch.nn.Module, _args: Any, _output: Any) -> None:
            if training_forward(module):
                on_end()

        handles.add(model.register_forward_hook(post))


def add_module_ranges(model: torch.nn.Module, ranges: NvtxRanges, handles: HookHandles) -> None:
    """An NVTX range around every submodule's forward, named by its qualified name."""
    if not ranges.active:
        return
    for name, module in model.named_modules():
        label = name or type(model).__name__

        def pre(_module: Any, _args: Any, label: str = label) -> None:
            ranges.push(label)

        def post(_module: Any, _args: Any, _output: Any) -> None:
            ranges.pop()

        handles.add(module.register_forward_pre_hook(pre))
        handles.add(module.register_forward_hook(post, always_call=True))


class InstancePatches:
    """Methods replaced on one object (its ``__dict__``), for the length of a run; ``restore()`` is idempotent.

    The class and every other instance are left alone, and an override in a user's subclass is what
    gets wrapped.
    """

    def __init__(self) -> None:
        self._patched: list[tuple[Any, str]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        owner.__dict__[name] = value
        self._patched.append((owner, name))

    def restore(self) -> None:
        patched, self._patched = self._patched, []
        for owner, name in reversed(patched):
            owner.__dict__.pop(name, None)


def wrap_construction(cls: type, before: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                      after: Callable[[Any], None] | None = None) -> Callable[[], None]:
    """Replace ``cls.__init__`` (for ``perfhooks run``): ``before(kwargs)`` returns the keyword arguments to
    build with, ``after(instance)`` runs on the built object. A fault in either is reported once and the object
    is built as the user asked. Returns the undo, which puts the original ``__init__`` back."""
    from perfhooks.faults import FaultLog

    original = cls.__init__
    faults = FaultLog()

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if before is not None:
            try:
                kwargs = before(dict(kwargs))
            except Exception as error:  # never into the user's script
                faults.report("perfhooks run", error)
        original(self, *args, **kwargs)
        if after is not None:
            try:
                after(self)
            except Exception as error:
                faults.report("perfhooks run", error)

    cls.__init__ = __init__  # type: ignore[misc]

    def undo() -> None:
        cls.__init__ = original  # type: ignore[misc]

    return undo


def timed_aside(engine: Any, kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run as an aside of ``kind`` (``evaluation``, ``checkpoint``); its errors noted and re-raised."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        with engine.aside(kind):
            return method(*args, **kwargs)

    return noting_errors(engine, timed)


def noting_errors(engine: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, with an error that passes through it noted by the engine (the caller may still catch it)."""

    def noted(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except BaseException as error:
            engine.note_error(error)
            raise

    return noted
