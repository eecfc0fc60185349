"""Rank summaries through the job's own process group's key-value store: never a collective, bounded waits.

When a ``torch.distributed`` process group exists, each rank ``set``s its summary (a few KB of JSON) under
``perfhooks/<run index>/rank<R>`` in the group's store (the TCPStore that torchrun, Lightning and accelerate
already run), and rank 0 polls for the others' keys until a deadline. Node-local output folders need
nothing shared; a rank that died or is late is reported missing, and nobody waits beyond the bound. The
run index counts the multi-rank runs closed in this process, so every rank of a sweep agrees on it.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from perfhooks.report.schema import json_safe

PREFIX = "perfhooks"
_RUNS = itertools.count()


def default_store() -> Any | None:
    """The default process group's store, or None without an initialised process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    return getter() if getter is not None else None


def next_index() -> int:
    return next(_RUNS)


def _key(index: int, rank: int) -> str:
    return f"{PREFIX}/{index}/rank{rank}"


def publish(store: Any, index: int, rank: int, summary: dict[str, Any]) -> None:

    store.set(_key(index, rank), json.dumps(json_safe(summary)))


def collect(store: Any, index: int, ranks: list[int], wait_s: float, poll_s: float = 0.05
            ) -> tuple[list[dict[str, Any]], list[int]]:
    """The summaries of ``ranks`` that arrive within ``wait_s`` seconds, and the ranks still missing then."""
    deadline = time.monotonic() + wait_s
    waiting = {rank: _key(index, rank) for rank in ranks}
    found: dict[int, dict[str, Any]] = {}
    while True:
        for rank, key in list(waiting.items()):
            if store.check([key]):  # get() would block until the key exists
                found[rank] = json.loads(store.get(key))
                del waiting[rank]
        if not waiting or time.monotonic() >= deadline:
            return [found[rank] for rank in sorted(found)], sorted(waiting)
        time.sleep(poll_s)
