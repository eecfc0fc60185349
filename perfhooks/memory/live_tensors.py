"""What holds the memory: every live tensor, attributed to parameters, gradients, optimizer state,
or activations and other tensors, counted once per storage (views share their base's bytes)."""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

import torch

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations_other")


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
                       top: int = 20) -> dict[str, Any]:
    """Bytes per category (``*_bytes``) and the ``top`` largest storages, from one scan of live objects.

    ``optimizers`` default to every live ``torch.optim.Optimizer``.
    """
    objects = gc.get_objects()
    try:
        return _census(objects, models, optimizers, top)
    finally:
        del objects  # the scan holds every object alive: drop it before anything else happens


def _census(objects: list[Any], models: Iterable[torch.nn.Module], optimizers: Iterable[Any] | None,
            top: int) -> dict[str, Any]:
    if optimizers is None:
        optimizers = [obj for obj in objects if issubclass(type(obj), torch.optim.Optimizer)]
    known: dict[tuple[str, int], str] = {}
    extra: list[torch.Tensor] = []
    for model in models:
        for parameter in model.parameters():
            key = _storage_key(parameter)
            if key is not None:
                known[key] = "parameters"
                extra.append(parameter)
            if parameter.grad is not None and (grad_key := _storage_key(parameter.grad)) is not None:
                known.setdefault(grad_key, "gradients")
                extra.append(parameter.grad)
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        for state in getattr(inner, "state", {}).values():
            for tensor in _tensors_in(state):
                key = _storage_key(tensor)
                if key is not None:
                    known.setdefault(key, "optimizer_state")
                    extra.append(tensor)
    storages: dict[tuple[str, int], tuple[torch.Tensor, int]] = {}
    for source in (extra, objects):
        for obj in source:
            if issubclass(type(obj), torch.Tensor):  # type(): some objects warn when __class__ is read
                key = _storage_key(obj)
                if key is not None and key not in storages:
                    storages[key] = (obj, obj.untyped_storage().nbytes())
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
    rows.clear()
    storages.clear()
    return {**totals, "total_bytes": sum(totals.values()), "tensors": count, "largest": largest}
