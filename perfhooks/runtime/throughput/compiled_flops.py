"""The FLOPs of a ``torch.compile``'d model's step, counted on its original module with meta tensors.

``FlopCounterMode`` cannot run over a compiled model's step: entering a dispatch mode would recompile its graphs.
So for each ``OptimizedModule`` in the watched model, a forward pre-hook on the wrapper (it runs in eager Python,
outside the compiled frame: no graph break) takes the call's arguments in the armed step and counts, under
``FlopCounterMode``, the forward and backward of the wrapper's ``_orig_mod`` on *meta* tensors of the same shapes
and dtypes (``torch.func.functional_call`` with meta parameters): nothing is computed, nothing of the user's
tensors, parameters or gradients is touched, and no device is called. Each forward of the step (each micro-batch)
adds its count, as the eager meter does. The backward is taken from the output's loss (``loss`` of a model
output, else the first tensor that requires grad, summed): the model's backward; a loss computed outside the
module adds no matmul.

A module compiled in place (``module.compile()``) has no eager wrapper to hook: its step is not counted, and the
report says so. So is a module whose forward cannot run on meta tensors (a data-dependent ``.item()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def compiled_wrappers(model: torch.nn.Module) -> tuple[list[torch.nn.Module], bool]:
    """The outermost ``OptimizedModule`` wrappers in ``model`` (``model`` itself included), and whether any module
    is compiled in place (``module.compile()``), which has none."""
    wrappers: list[torch.nn.Module] = []
    in_place = False
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        original = getattr(module, "_orig_mod", None)
        if isinstance(original, torch.nn.Module):
            wrappers.append(module)
            inside.update(id(sub) for sub in original.modules())
        elif getattr(module, "_compiled_call_impl", None) is not None:
            in_place = True
    return wrappers, in_place


def count_on_meta(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  custom_mapping: dict[Any, Any]) -> float:
    """FLOPs of ``module``'s forward and backward on meta copies of its parameters, buffers and inputs."""
    from torch.func import functional_call
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import FlopCounterMode

    def meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            copy = torch.empty_like(value, device="meta")
            return copy.requires_grad_(value.requires_grad) if value.is_floating_point() else copy
        return value

    # tied weights (an LM head sharing the embedding) appear once, and functional_call ties them again
    state = {name: meta(p) for name, p in module.named_parameters()}
    state.update({name: meta(b) for name, b in module.named_buffers()})
    with FlopCounterMode(display=False, custom_mapping=custom_mapping) as mode:
        output = functional_call(module, state, tree_map(meta, args), tree_map(meta, kwargs), tie_weights=True,
                                 strict=False)
        loss = _loss(output)
        if loss is not None:
            (loss if loss.dim() == 0 else loss.float().sum()).backward()
    return float(mode.get_total_flops())


def _loss(output: Any) -> torch.Tensor | None:
    """The tensor whose backward is the model's: a model output's ``loss``, else the first tensor needing grad."""
    loss = getattr(output, "loss", None) if not isinstance(output, torch.Tensor) else None
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(output.to_tuple() if callable(getattr(output, "to_tuple", None)) else output)
    return next((leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.requires_grad), None)


def hook_wrappers(wrappers: list[torch.nn.Module],
                  on_call: Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any]], None],
                  add_handle: Callable[[Any], None]) -> None:
    """A forward pre-hook on each wrapper calling ``on_call(original_module, args, kwargs)`` (eager, outside the
    compiled frame; not while dynamo traces an outer region)."""
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    for wrapper in wrappers:
        original = wrapper._orig_mod

        def pre(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                original: Any = original) -> None:
            if not compiling():
                on_call(original, args, kwargs)

        add_handle(wrapper.register_forward_pre_hook(pre, with_kwargs=True))
