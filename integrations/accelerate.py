"""accelerate: one call wires a hand-written loop.

    perf = attach(accelerator, model, optimizer, dataloader, output_dir="runs/perf")
    for batch in dataloader:                 # the same, prepared dataloader object
        with accelerator.accumulate(model):
            loss = loss_fn(model(batch))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    perf.close()                              # or: with attach(...) as perf: ...

Where the events come from:

=====================================  ==========================================
the loop                               engine
=====================================  ==========================================
``next()`` on the dataloader           ``phase_start("data_wait")`` (ends the step if the optimizer stepped)
model forward pre-hook                 ``phase_start("forward")``; the forward phase includes the loss
``accelerator.backward`` (wrapped)     ``phase_start("backward")`` ... ``phase_end("backward")``
torch optimizer step pre/post hooks    ``phase_start("optimizer")`` / ``phase_end("optimizer")``
end of the dataloader, ``close()``     ``step_end()`` if the optimizer stepped; ``idle()``
``accelerator.profile()`` (wrapped)    capture windows step aside for the user's profiler
=====================================  ==========================================

The hooks sit on the torch optimizer under the ``AcceleratedOptimizer``; it steps only when
gradients sync, so ``accelerator.accumulate`` adds micro-batches to a step, never steps.
The dataloader is left as the same object: its class is swapped for a subclass whose
``__iter__`` times ``next()``, and restored by ``close()``; ``accelerator.backward`` and
``accelerator.profile`` are wrapped on the instance and restored likewise.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from perfhooks.config import PerfConfig
from perfhooks.engine import Engine
from perfhooks.hooks import HookHandles, watch_optimizer_steps, watch_training_forward
from perfhooks.phases import BACKWARD, DATA_WAIT, FORWARD, OPTIMIZER
from perfhooks.sinks.wandb import RunSource


def attach(accelerator: Any, model: Any, optimizer: Any, dataloader: Any,
           output_dir: str | os.PathLike[str] | None = None, **settings: Any) -> PerfSession:
    """Profile a hand-written accelerate loop; returns a session to ``close()`` (or use as a context manager).

    Args:
        accelerator, model, optimizer, dataloader: the ones ``accelerator.prepare`` returned.
        output_dir: where ``report.json`` and ``traces/`` go; default ``<accelerator.project_dir>/perfhooks``
            or ``./perfhooks``.
        **settings: any :class:`perfhooks.PerfConfig` field (``schedule``, ``max_traces``, ...).
    """
    config = PerfConfig.from_kwargs("attach", {"output_dir": output_dir, **settings})
    for name, value in (("model", model), ("optimizer", optimizer), ("dataloader", dataloader)):
        if value is None:
            raise TypeError(f"attach() needs the prepared {name}, got None")
    if not hasattr(type(dataloader), "__iter__"):
        raise TypeError(f"attach() dataloader must be iterable, got {type(dataloader).__name__}")
    if not callable(getattr(accelerator, "backward", None)):
        raise TypeError(f"attach() accelerator must be an accelerate.Accelerator, got {type(accelerator).__name__}")
    return PerfSession(accelerator, model, optimizer, dataloader, config)


def _set_class(instance: Any, cls: type) -> None:
    """Assign ``instance.__class__`` through ``object``'s own descriptor.

    accelerate's ``DataLoaderShard`` overrides ``__class__`` with a read-only property (so that
    it passes ``isinstance`` checks as the DataLoader it wraps); the subclass keeps that property.
    """
    object.__dict__["__class__"].__set__(instance, cls)


def _wandb_tracker_run(accelerator: Any) -> Any | None:
    """The run of the accelerator's W&B tracker (``log_with="wandb"``), once ``init_trackers`` made it."""
    for tracker in getattr(accelerator, "trackers", None) or []:
        if getattr(tracker, "name", None) == "wandb":
            return tracker.run
    return None


class PerfSession:
    """The wiring ``attach`` made; ``close()`` (idempotent) unwires it and writes the report."""

    def __init__(self, accelerator: Any, model: Any, optimizer: Any, dataloader: Any, config: PerfConfig) -> None:
        self.accelerator = accelerator
        self.dataloader = dataloader
        self._hooks = HookHandles()
        self._stepped = False
        self._original_class = type(dataloader)
        self._closed = False
        output_dir = config.output_dir or os.path.join(getattr(accelerator, "project_dir", None) or ".", "perfhooks")
        self.engine = Engine.start(config, output_dir, framework="accelerate", device=accelerator.device,
                                   wandb_source=RunSource(lambda: _wandb_tracker_run(accelerator)))
        if self.engine is None:
            self._closed = True
            return
        if getattr(accelerator, "profile_handler", None) is not None:
            self.engine.defer_windows_to("accelerate's ProfileKwargs")
        watch_training_forward(model, self._forward_start, None, self._hooks)
        watch_optimizer_steps([optimizer], self._optimizer_end, self._hooks, on_before_step=self._optimizer_start)
        self.engine.watch_model(model)
        self._wrap_backward()
        self._wrap_profile()
        self._wrap_dataloader()

    # --------------------------------------------------------------- events
    def _forward_start(self) -> None:
        self.engine.phase_start(FORWARD)

    def _optimizer_start(self) -> None:
        self.engine.phase_start(OPTIMIZER)

    def _optimizer_end(self) -> None:
        self.engine.phase_end(OPTIMIZER)
        self._stepped = True

    def _before_next(self) -> None:
        if self._stepped:
            self._stepped = False
            self.engine.step_end()
        self.engine.phase_start(DATA_WAIT)

    def _exhausted(self) -> None:
        if self._stepped:
            self._stepped = False
            self.engine.step_end()
        self.engine.idle()

    # --------------------------------------------------------------- wrappers
    def _wrap_backward(self) -> None:
        original = self.accelerator.backward
        engine = self.engine

        def backward(loss: Any, **kwargs: Any) -> Any:
            engine.phase_start(BACKWARD)
            try:
                return original(loss, **kwargs)
            finally:
                engine.phase_end(BACKWARD)

        self.accelerator.backward = backward

    def _wrap_profile(self) -> None:
        original = self.accelerator.profile
        engine = self.engine

        @contextlib.contextmanager
        def profile(*args: Any, **kwargs: Any) -> Iterator[Any]:
            engine.defer_windows_to("accelerator.profile()")
            with original(*args, **kwargs) as profiler:
                yield profiler

        self.accelerator.profile = profile

    def _wrap_dataloader(self) -> None:
        session = self
        base = self._original_class

        def __iter__(loader: Any) -> Iterator[Any]:
            iterator = base.__iter__(loader)
            while True:
                session._before_next()
                try:
                    batch = next(iterator)
                except StopIteration:
                    session._exhausted()
                    return
                yield batch

        _set_class(self.dataloader, type(base.__name__, (base,), {"__iter__": __iter__, "__module__": base.__module__}))

    # --------------------------------------------------------------- end
    def close(self) -> dict[str, Any] | None:
        """Unwire the loop, end the last step and write the report (idempotent)."""
        if self._closed:
            return None
        self._closed = True
        self._hooks.remove()
        for name in ("backward", "profile"):
            self.accelerator.__dict__.pop(name, None)
        _set_class(self.dataloader, self._original_class)
        if self._stepped:
            self.engine.step_end()
        return self.engine.close()

    def __enter__(self) -> PerfSession:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if error is not None and self.engine is not None and not self._closed:
            self.engine.exception(error)
        self.close()
        return False
