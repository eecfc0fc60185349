"""Which process this is in a multi-process run, without initialising anything."""

from __future__ import annotations

import os


def rank() -> int:
    """Global rank: from ``torch.distributed`` when initialised, else ``RANK``, else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def logs_to_trackers(rank: int) -> bool:
    """Whether this rank logs to experiment trackers (W&B): rank 0 only, as the frameworks' loggers do.

    The one place where rank gating is decided; every rank writes its own local files.
    """
    return rank == 0
