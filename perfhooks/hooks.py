"""Torch hooks every integration needs, registered through torch's own APIs (no monkeypatching)."""

from __future__ import annotations

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


def watch_optimizer_steps(optimizers: Iterable[torch.optim.Optimizer], on_after_step: Callable[[], None],
                          handles: HookHandles) -> None:
    """Call ``on_after_step`` after each ``optimizer.step()`` (torch's step post-hook).

    An optimizer without torch's hook API is skipped: its phase then ends with the step.
    """
    for optimizer in optimizers:
        register = getattr(optimizer, "register_step_post_hook", None)
        if register is not None:
            handles.add(register(lambda *_: on_after_step()))


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
