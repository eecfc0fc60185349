"""Samples and tokens in a fetched batch, from host metadata (shapes): never a device sync.

- **samples**: the leading dimension of ``input_ids`` when the batch has it, else of the first tensor found
  (a tensor, a tuple/list of them, or a mapping such as HF's ``BatchEncoding``);
- **tokens**: ``attention_mask.sum()`` (padding left out) when the batch has a 2-D ``attention_mask`` on the
  CPU; else the element count of a 2-D ``input_ids`` (padding included); else, with no mapping, the element count
  of a first tensor that is 2-D and of an integer dtype (token ids: nanoGPT's ``x``). A mask on an accelerator is
  not read: its sum is a device op whose value the host would have to wait for. The tracker reads it instead as the
  DataLoader handed the batch over, on the host (:mod:`~perfhooks.runtime.hooks.host_batches`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: Where a step's token count came from (the report's ``throughput.token_source``).
FROM_MASK = "attention_mask"
FROM_IDS = "input_ids"
FROM_IDS_MASK_ON_DEVICE = "input_ids (attention_mask not read on an accelerator: reading it would sync)"
FROM_HOST_MASK = "attention_mask, read on the host as the DataLoader gave it, before the framework moved it"
FROM_INTEGER_TENSOR = "a 2-D integer tensor taken as token ids (nanoGPT's x)"


@dataclass(frozen=True, slots=True)
class BatchCount:
    samples: int
    tokens: int
    token_source: str | None
    #: Token slots the batch holds, padding included (``attention_mask.numel()``); 0 when no mask was read.
    padded: int = 0


def count_batch(batch: Any) -> BatchCount | None:
    """Samples and tokens of one micro-batch, or None when it holds no tensor with a leading dimension."""
    if type(batch) is torch.Tensor:  # the common plain-loop batch, ``x``: answered without the general walk
        return _count_tensor(batch) if batch.dim() >= 1 else None
    ids = mask = None
    if isinstance(batch, Mapping):
        ids, mask = batch.get("input_ids"), batch.get("attention_mask")
    lead = ids if _is_batched(ids) else _first_tensor(batch)
    if lead is None:
        return None
    samples = int(lead.shape[0])
    if _is_batched(mask) and mask.dim() == 2:
        if mask.device.type == "cpu":
            return BatchCount(samples, int(mask.sum()), FROM_MASK, int(mask.numel()))
        if _is_batched(ids) and ids.dim() == 2:
            return BatchCount(samples, int(ids.numel()), FROM_IDS_MASK_ON_DEVICE)
    if _is_batched(ids) and ids.dim() == 2:
        return BatchCount(samples, int(ids.numel()), FROM_IDS)
    if ids is None:
        return _count_tensor(lead)
    return BatchCount(samples, 0, None)


def _count_tensor(lead: torch.Tensor) -> BatchCount:
    """A batch led by ``lead`` (no ``input_ids``): its samples, and its tokens when it is a 2-D integer tensor."""
    samples = int(lead.shape[0])
    if lead.dim() == 2 and not lead.is_floating_point() and not lead.is_complex() and lead.dtype != torch.bool:
        return BatchCount(samples, int(lead.numel()), FROM_INTEGER_TENSOR)
    return BatchCount(samples, 0, None)


def host_mask(batch: Any) -> torch.Tensor | None:
    """The batch's 2-D ``attention_mask`` when it is on the CPU (kept, not summed: only a batch the framework then
    moves to a device needs its sum), else None."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    return mask if _is_batched(mask) and mask.dim() == 2 and mask.device.type == "cpu" else None


def batch_shape(batch: Any) -> tuple[Any, ...]:
    """The shapes of a micro-batch's tensors (a mapping's values, a sequence's items, or the tensor): what a new
    padded length or batch size changes. Host metadata only."""
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape),)
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return tuple(tuple(item.shape) for item in itertools.islice(items, MAX_SHAPED_ITEMS)
                 if isinstance(item, torch.Tensor))


#: Items of a batch whose shapes make its shape key (a batch that is a long list of tensors costs no more).
MAX_SHAPED_ITEMS = 16


def _is_batched(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 1


def _first_tensor(value: Any, depth: int = 0) -> torch.Tensor | None:
    if _is_batched(value):
        return value
    if depth > 3:
        return None
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


#: Distinct batch shapes remembered: past it, no shape counts as new (a run with a fresh shape every step).
MAX_SHAPES = 4096


#: Tensors in a tuple or list batch that is looked up by its shapes (a longer one is counted each time).
MAX_KEYED_ITEMS = 8


def _tensor_batch_key(batch: Any) -> tuple[Any, ...] | None:
    """The shapes and dtypes of a batch that is a tensor, or a tuple or list of tensors (``x``, ``(x, y)``): all
    its count and shape depend on, so one count serves every batch with the same key. None for anything else (a
    mapping's count may read its attention mask's values)."""
    kind = type(batch)
    if kind is Tensor:
        return (batch.shape, batch.dtype)
    if (kind is tuple or kind is list) and 0 < len(batch) <= MAX_KEYED_ITEMS:
        key: list[Any] = [kind]
        for item in batch:
            if type(item) is not Tensor:
                return None
            key.append(item.shape)
            key.append(item.dtype)
        return tuple(key)
    return None


class BatchCounter:
    """What a run's batches hold, counted on its detailed steps: samples, tokens and padded slots into the open
    step's record, the token count's source, and the distinct shapes seen (a step that meets a new one may pay for
    it: shape churn). A batch of tensors is counted once per shapes and dtypes, then looked up."""

    def __init__(self) -> None:
        #: The batch's token count's source, once a batch was counted.
        self.token_source: str | None = None
        #: The batch shapes seen so far (bounded).
        self.shapes: set[tuple[Any, ...]] = set()
        #: A tensor batch's count and shape by its shapes and dtypes (:func:`_tensor_batch_key`).
        self._tensor_batches: dict[tuple[Any, ...], tuple[BatchCount | None, Any]] = {}
        #: The training batches' masks as the DataLoader gave them, on the host, before the framework moved them
        #: (:mod:`~perfhooks.runtime.hooks.host_batches`), in order: each batch seen on the device takes the oldest
        #: and sums it only when its own mask is off the host. Bounded: a prefetching loader is a batch or two ahead.
        self.host_masks: deque[Any] = deque(maxlen=8)

    def host_batch(self, batch: Any) -> None:
        """A batch as the DataLoader handed it over on the host: its mask, for the device batch that follows."""
        self.host_masks.append(host_mask(batch))

    def count(self, record: Any, batch: Any) -> None:
        """Add ``batch``'s samples, tokens, padded slots and shape to the open step's ``record``."""
        key = _tensor_batch_key(batch)
        if key is not None:  # ``x`` or ``(x, y)``: counted once per shapes and dtypes, then looked up
            known = self._tensor_batches.get(key)
            if known is None:
                known = self._count_tensor_batch(record, key, batch)
            counted, shape = known
            if counted is None:
                return
        else:
            counted, shape = count_batch(batch), None
            if counted is None:
                return
        if self.host_masks:  # the same batch as the DataLoader gave it, in order
            mask = self.host_masks.popleft()
            if counted.token_source != FROM_IDS_MASK_ON_DEVICE:
                self.host_masks.clear()  # a mask readable here (a CPU run): the host's are not needed
            elif mask is not None and int(mask.shape[0]) == counted.samples:
                counted = BatchCount(counted.samples, int(mask.sum()), FROM_HOST_MASK, int(mask.numel()))
        record.samples += counted.samples
        record.tokens += counted.tokens
        record.padded_tokens += counted.padded
        if shape is None:
            shape = batch_shape(batch)
            self._note_shape(record, shape)
        record.shape = hash((record.shape, shape))
        if counted.token_source is not None:
            self.token_source = counted.token_source

    def _count_tensor_batch(self, record: Any, key: tuple[Any, ...], batch: Any) -> tuple[BatchCount | None, Any]:
        """Count a batch of tensors whose shapes and dtypes were not seen before, and note its shape: what
        :meth:`count` looks up for every later batch like it (bounded, as the shapes are)."""
        counted = count_batch(batch)
        shape = batch_shape(batch)
        if counted is not None:
            self._note_shape(record, shape)
        if len(self._tensor_batches) < MAX_SHAPES:
            self._tensor_batches[key] = (counted, shape)
        return counted, shape

    def _note_shape(self, record: Any, shape: tuple[Any, ...]) -> None:
        if shape not in self.shapes and len(self.shapes) < MAX_SHAPES:
            self.shapes.add(shape)
            record.new_shape = True
