"""What holds the memory: every live tensor, attributed to parameters, gradients, optimizer state,
or activations and other tensors, counted once per storage (views share their base's bytes).

A tensor subclass that wraps others (FSDP2's and tensor parallel's ``DTensor``, float8 wrappers) holds no
storage of its own: it is counted by the tensors it wraps (a DTensor by its local shard). Tensors that autograd
saves only in C++ are not Python objects, so a walk of live objects misses most activations: on CUDA, with the
device's allocated bytes given, activations and other tensors are what is allocated less the parameters,
gradients and optimizer state found on that device.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

import torch

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations_other")


def _plain(tensor: torch.Tensor, depth: int = 0) -> Iterable[torch.Tensor]:
    """The tensors with storage behind ``tensor``: itself, or for a wrapper subclass (``__tensor_flatten__``:
    DTensor, float8) the tensors it wraps, recursively."""
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is None or depth > 4:
        yield tensor
        return
    try:
        names, _context = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    except Exception:  # not a traceable wrapper after all
        yield tensor
        return
    for name in names:
        inner = getattr(tensor, name, None)
        if isinstance(inner, torch.Tensor):
            yield from _plain(inner, depth + 1)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    try:
        storage = tensor.untyped_storage()
        return (str(tensor.device), storage.data_ptr()) if storage.nbytes() else None
    except (RuntimeError, NotImplementedError):  # meta, sparse or other storage-less tensors
        return None


def _tensors_in(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def live_tensor_census(models: Iterable[torch.nn.Module] = (), optimizers: Iterable[Any] | None = None,
                       top: int = 20, allocated: tuple[str, int] | None = None) -> dict[str, Any]:
    """Bytes per category (``*_bytes``) and the ``top`` largest storages, from one scan of live objects.

    ``optimizers`` default to every live ``torch.optim.Optimizer``. ``allocated``: (device, bytes the allocator
    has allocated there), e.g. ``("cuda:0", torch.cuda.memory_allocated(0))``: activations and other tensors on
    that device are then at least what is allocated less the parameters, gradients and state found on it
    (``activations_source``: ``walked`` or ``allocated_less_known``).
    """
    objects = gc.get_objects()
    try:
        return _census(objects, models, optimizers, top, allocated)
    finally:
        del objects  # the scan holds every object alive: drop it before anything else happens


def _census(objects: list[Any], models: Iterable[torch.nn.Module], optimizers: Iterable[Any] | None,
            top: int, allocated: tuple[str, int] | None) -> dict[str, Any]:
    if optimizers is None:
        optimizers = [obj for obj in objects if issubclass(type(obj), torch.optim.Optimizer)]
    known: dict[tuple[str, int], str] = {}
    extra: list[torch.Tensor] = []

    def note(tensor: torch.Tensor, category: str) -> None:
        for plain in _plain(tensor):
            key = _storage_key(plain)
            if key is not None:
                known.setdefault(key, category)
                extra.append(plain)

    for model in models:
        for parameter in model.parameters():
            note(parameter, "parameters")
        for parameter in model.parameters():
            if parameter.grad is not None:
                note(parameter.grad, "gradients")
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        for state in getattr(inner, "state", {}).values():
            for tensor in _tensors_in(state):
                note(tensor, "optimizer_state")
    storages: dict[tuple[str, int], tuple[torch.Tensor, int]] = {}
    for source in (extra, objects):
        for obj in source:
            if issubclass(type(obj), torch.Tensor):  # type(): some objects warn when __class__ is read
                for plain in _plain(obj):
                    key = _storage_key(plain)
                    if key is not None and key not in storages:
                        storages[key] = (plain, plain.untyped_storage().nbytes())
    totals = {f"{category}_bytes": 0 for category in CATEGORIES}
    rows = []
    for key, (tensor, nbytes) in storages.items():
        category = known.get(key, "activations_other")
        totals[f"{category}_bytes"] += nbytes
        rows.append((nbytes, tensor, category))
    rows.sort(key=lambda row: -row[0])
    largest = [{"bytes": nbytes, "shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", ""),
                "device": str(tensor.device), "category": category} for nbytes, tensor, category in rows[:top]]
    count = len(rows)
    source = "walked"
    if allocated is not None:
        device, allocated_bytes = allocated
        on_device = sum(nbytes for nbytes, tensor, category in rows
                        if category != "activations_other" and str(tensor.device) == device)
        walked = sum(nbytes for nbytes, tensor, category in rows
                     if category == "activations_other" and str(tensor.device) == device)
        if allocated_bytes - on_device > walked:  # what autograd holds in C++ is allocated but not walked
            totals["activations_other_bytes"] += allocated_bytes - on_device - walked
            source = "allocated_less_known"
    rows.clear()
    storages.clear()
    return {**totals, "total_bytes": sum(totals.values()), "tensors": count, "largest": largest,
            "activations_source": source}
