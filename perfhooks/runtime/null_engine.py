"""The engine of a run that is not profiled (perfhooks off, or an engine that failed to start)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from perfhooks.faults import FaultLog, Once


class NullEngine:
    """The engine of a run that is not profiled (perfhooks off, or an engine that failed to start), as Lightning's
    ``PassThroughProfiler``: every event is a no-op, so adapters call the engine unconditionally and "off" costs
    one attribute lookup and a call."""

    #: False: nothing is profiled (an :class:`Engine` is ``active``).
    active = False
    #: A null run never opens, so there is nothing to close.
    closed = True
    open_phase: str | None = None
    memory = None

    def __init__(self) -> None:
        self.faults = FaultLog()
        self.once = Once()

    def fetch(self) -> None:
        pass

    def training_ended(self) -> None:
        pass


    def named(self, name: str, ms: float) -> None:
        pass

    def set_hook_timing(self, on: bool) -> None:
        pass

    def batch(self, batch: Any) -> None:
        pass

    def note_flops(self, per_step: float, source: str) -> None:
        pass

    def note_precision(self, dtype: str, source: str) -> None:
        pass

    def note_recipe(self, read: Any) -> None:
        pass

    def fetched(self, batches: int) -> None:
        pass

    def stepped(self, global_step: int | None = None) -> None:
        pass

    def step_start(self) -> None:
        pass

    def phase_start(self, name: str) -> None:
        pass

    def phase_end(self, name: str) -> None:
        pass

    def step_end(self) -> None:
        pass

    def idle(self) -> None:
        pass

    def aside_start(self, kind: str) -> None:
        pass

    def aside_end(self, kind: str) -> None:
        pass

    def aside_cancel(self, kind: str) -> None:
        pass

    @contextlib.contextmanager
    def aside(self, kind: str) -> Iterator[None]:
        yield

    def note_error(self, error: BaseException) -> None:
        pass

    def exception(self, error: BaseException, deadline_s: float | None = None, quiet: bool = False) -> None:
        pass

    def abandon(self, deadline_s: float | None = None, quiet: bool = False, superseded: bool = False) -> None:
        pass

    def close(self, deadline_s: float | None = None) -> dict[str, Any] | None:
        return None

    def watch_model(self, model: Any) -> None:
        pass

    def watch_optimizer(self, optimizer: Any) -> None:
        pass

    def defer_windows_to(self, owner: str) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
