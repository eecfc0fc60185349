"""Store traffic that does not grow with the ranks: 64 simulated ranks on one real torch.distributed store (a
HashStore behind a counting wrapper), with a manual clock, so every count is exact."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch.distributed as dist

from perfhooks.capture.trigger import OnDemandTrigger
from perfhooks.distributed import store as rank_store
from perfhooks.distributed.all_ranks import AllRanksTrigger
from perfhooks.faults import Once

RANKS = 64


class CountingStore:
    """A real store; every call (one RPC on a TCPStore) is counted by method."""

    def __init__(self) -> None:
        self.store = dist.HashStore()
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return counted

    def total(self) -> int:
        return sum(self.calls.values())


class ManualTime:
    """``time.monotonic`` and ``time.sleep`` by hand; each sleep lets ``on_sleep`` publish more ranks."""

    def __init__(self, on_sleep: Any) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.on_sleep(len(self.sleeps))


def _summary(rank: int) -> dict[str, Any]:
    return {"rank": rank, "steps": 10, "step_ms": {"mean": 5.0 + rank}}


def test_rank_0_waits_with_one_rpc_per_round_whatever_the_world_size() -> None:
    store = CountingStore()
    index = rank_store.next_index()
    rank_store.publish(store, index, 0, _summary(0))
    late = iter(range(1, RANKS))

    def publish_eight(_round: int) -> None:  # 8 more ranks publish during each pause
        for rank in [r for _, r in zip(range(8), late, strict=False)]:
            rank_store.publish(store, index, rank, _summary(rank))

    time = ManualTime(publish_eight)
    store.calls.clear()
    before = store.total()
    summaries, missing = rank_store.collect(store, index, list(range(1, RANKS)), wait_s=60.0, published=RANKS,
                                            sleep=time.sleep, clock=time.clock)
    collector = store.total() - before - 2 * (RANKS - 1)  # less the others' own publications (set + add each)
    rounds = len(time.sleeps) + 1
    assert missing == [] and [s["rank"] for s in summaries] == list(range(1, RANKS))
    assert rounds == 9  # 63 late ranks, 8 a pause
    assert collector == rounds + 1, "one counter read per round, one multi_get at the end"
    assert store.calls["check"] == 0 and store.calls["get"] == 0
    assert time.sleeps[:4] == [0.05, 0.1, 0.2, 0.4] and max(time.sleeps) == 1.0  # backoff, capped


def test_ranks_still_missing_at_the_deadline_are_named_with_one_look_each_once() -> None:
    store = CountingStore()
    index = rank_store.next_index()
    for rank in range(RANKS - 4):  # ranks 60-63 never publish (they died)
        rank_store.publish(store, index, rank, _summary(rank))
    time = ManualTime(lambda _round: None)
    store.calls.clear()
    summaries, missing = rank_store.collect(store, index, list(range(1, RANKS)), wait_s=10.0, published=RANKS,
                                            sleep=time.sleep, clock=time.clock)
    rounds = len(time.sleeps) + 1
    assert missing == [60, 61, 62, 63] and len(summaries) == RANKS - 5
    assert store.calls["add"] == rounds  # one counter read per round, 10 s of backoff: a handful of rounds
    assert rounds <= 15
    assert store.calls["check"] == RANKS - 1 and store.calls["multi_get"] == 1  # the deadline's one look each


def test_the_all_ranks_trigger_reads_one_key_per_poll_per_rank(tmp_path: Path) -> None:
    store = CountingStore()
    watchers = []
    for rank in range(RANKS):
        (tmp_path / f"rank{rank}").mkdir()
        local = OnDemandTrigger(tmp_path / f"rank{rank}", poll_s=1.0, use_signal=False)
        watchers.append(AllRanksTrigger(store, 0, rank, local, 1.0, lambda: 0, 4, lambda step: True, Once(),
                                        clock=lambda: 0.0))
    for watcher in watchers:
        watcher.poll_once()
    assert store.total() == RANKS, "one RPC per rank per poll"
    assert store.calls == Counter({"check": RANKS})
