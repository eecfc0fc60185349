"""The simulated GPU with perfhooks bound to it, for the tests that count what a steady step costs."""

from __future__ import annotations

from typing import Any

import pytest
from simulated_gpu import simulated_cuda

from perfhooks.runtime.engine import Engine
from perfhooks.runtime.step import timing_reader


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch):
    """perfhooks bound to ``cuda:0`` of the simulation (the model's tensors stay on the CPU: a CPU build); the
    timing reader reads every 10 ms, so that several reads fall inside the measured steps and return their events
    to the pool."""
    start = Engine.start.__func__  # type: ignore[attr-defined]

    def on_device(cls: type, *args: Any, **kwargs: Any) -> Any:
        kwargs["device"] = "cuda:0"
        return start(cls, *args, **kwargs)

    monkeypatch.setattr(Engine, "start", classmethod(on_device))
    monkeypatch.setattr(timing_reader, "READ_EVERY_S", 0.01)
    with simulated_cuda(memory_bytes=1 << 30) as gpu:
        yield gpu
