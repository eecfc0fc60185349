"""What every loop session shares (accelerate's ``attach``, ``perfhooks.profile``): a context manager whose
``close()`` detaches once, never raises into the loop, and writes the report; an error leaving the block is noted
for the report and goes on unchanged."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch

from perfhooks.faults import FaultLog


def listed(given: Any, default: Iterable[Any] = ()) -> list[Any]:
    """``given`` as a list (one object, a list or a tuple of them); ``default`` when it is ``None``."""
    if given is None:
        return list(default)
    return list(given) if isinstance(given, (list, tuple)) else [given]


def check_models_and_optimizers(caller: str, models: list[Any], optimizers: list[Any]) -> None:
    """A ``TypeError`` naming ``caller``'s parameter for anything that is not a module or an optimizer."""
    for item in models:
        if not isinstance(item, torch.nn.Module):
            raise TypeError(f"{caller}() model must be a torch.nn.Module or a list of them, got {type(item).__name__}")
    for item in optimizers:
        if not callable(getattr(item, "step", None)):
            raise TypeError(f"{caller}() optimizer must be an optimizer (with a step method) or a list of them, "
                            f"got {type(item).__name__}")


class LoopSession:
    """Subclasses set ``engine`` and ``_closed`` and implement :meth:`_detach`."""

    engine: Any
    _closed: bool

    def _detach(self) -> None:
        """Remove what the session added to the loop, and drop its references to the loop's objects."""
        raise NotImplementedError

    def close(self) -> dict[str, Any] | None:
        """Detach, end the last step and write the report (idempotent); the report, or ``None`` when closed."""
        if self._closed:
            return None
        self._closed = True
        try:
            self._detach()
        except Exception as error:
            FaultLog().report("detach", error)
        return self.engine.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if error is not None and not self._closed:
            self.engine.exception(error)
        self.close()
        return False
