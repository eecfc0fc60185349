"""A safety net for runs whose framework gives no exception or end hook (the HF Trainer has neither
for errors): an uncaught exception is noted in the report, and an engine still open at
interpreter exit is closed, so a report is always written.

Neither changes what the user sees: the previous ``sys.excepthook`` still prints the error
and the exit status is untouched.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from types import TracebackType
from typing import Any


class ExitGuard:
    """Installed by an engine at start, removed by its ``close()``."""

    def __init__(self, engine: Any) -> None:
        self._engine = weakref.ref(engine)
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)

    def _excepthook(self, kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        engine = self._engine()
        try:
            if engine is not None:
                engine.exception(error)
        finally:
            self._previous_hook(kind, error, tb)

    def _at_exit(self) -> None:
        engine = self._engine()
        if engine is not None:
            engine.close()

    def remove(self) -> None:
        atexit.unregister(self._at_exit)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook
