"""Rank summaries through the job's own process group's key-value store: never a collective, bounded waits.

When a ``torch.distributed`` process group exists, each rank ``set``s its summary (a few KB of JSON) under
``perfhooks/<run index>/rank<R>`` in the group's store (the TCPStore that torchrun, Lightning and accelerate
already run) and adds one to ``perfhooks/<run index>/published``. Rank 0 reads that counter once per wait round,
with backoff (50 ms doubling to 1 s), and reads every summary in one ``multi_get`` once all have come: the
store's traffic per round does not grow with the ranks (1,000 ranks: one RPC a round, not 1,000). Only when the
deadline passes with ranks missing does it look for each key once, to name them. Node-local output folders need
nothing shared; a rank that died or is late is reported missing, and nobody waits beyond the bound. The
run index counts the multi-rank runs closed in this process, so every rank of a sweep agrees on it.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from perfhooks.report.schema import json_safe
from perfhooks.timebase import monotonic

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


#: The first and the longest pause between two reads of the counter (s).
FIRST_POLL_S = 0.05
MAX_POLL_S = 1.0


def _key(index: int, rank: int) -> str:
    return f"{PREFIX}/{index}/rank{rank}"


def _counter(index: int) -> str:
    return f"{PREFIX}/{index}/published"


def publish(store: Any, index: int, rank: int, summary: dict[str, Any]) -> None:
    """Two RPCs: the summary, then the count of ranks that published (in that order, so a count covers keys that
    exist)."""
    store.set(_key(index, rank), json.dumps(json_safe(summary)))
    store.add(_counter(index), 1)


def collect(store: Any, index: int, ranks: list[int], wait_s: float, published: int | None = None,
            poll_s: float = FIRST_POLL_S, sleep: Any = time.sleep, clock: Any = monotonic
            ) -> tuple[list[dict[str, Any]], list[int]]:
    """The summaries of ``ranks`` that arrive within ``wait_s`` seconds, and the ranks still missing then.

    ``published``: the counter's value once every rank has published (default ``len(ranks)``; the caller's own
    publication counts too). One RPC per wait round (the counter), one ``multi_get`` at the end.
    """
    deadline = clock() + wait_s
    expected = len(ranks) if published is None else published
    pause = poll_s
    while store.add(_counter(index), 0) < expected:
        left = deadline - clock()
        if left <= 0:
            return _present(store, index, ranks)
        sleep(min(pause, left))
        pause = min(pause * 2, MAX_POLL_S)
    return _read(store, [_key(index, rank) for rank in ranks]), []


def _present(store: Any, index: int, ranks: list[int]) -> tuple[list[dict[str, Any]], list[int]]:
    """At the deadline, with ranks missing: which keys exist (one look each, once), and their summaries."""
    present = [rank for rank in ranks if store.check([_key(index, rank)])]  # get() would block on a missing key
    missing = [rank for rank in ranks if rank not in present]
    return _read(store, [_key(index, rank) for rank in present]), missing


def _read(store: Any, keys: list[str]) -> list[dict[str, Any]]:
    """The summaries under ``keys`` (all present): one ``multi_get`` where the store has it."""
    if not keys:
        return []
    multi_get = getattr(store, "multi_get", None)
    values = multi_get(keys) if multi_get is not None else [store.get(key) for key in keys]
    return [json.loads(value) for value in values]
