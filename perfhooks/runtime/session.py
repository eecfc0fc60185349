"""What every loop session shares (accelerate's ``attach``, ``perfhooks.profile``): a context manager whose
``close()`` detaches once, never raises into the loop, and writes the report; an error leaving the block is noted
for the report and goes on unchanged."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from perfhooks.faults import FaultLog


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
