"""perfhooks' own clock, bound once, when perfhooks is imported: every time perfhooks reads, on every thread.

A user's test may patch ``time.monotonic``: Lightning's own suite replaces it with a counter to gate validation
by time, and ``freezegun`` freezes it. perfhooks reading it through the module attribute ran that counter 8 times
faster than the fit alone, and a frozen clock made it declare a stall of 1977 s. So perfhooks never reads an
attribute of ``time`` after import: its clock is the first of ``time.monotonic_ns`` and ``time.perf_counter_ns``
that is still the C builtin at import (a mock active while perfhooks is imported is passed over), else
``time.clock_gettime_ns(CLOCK_MONOTONIC)``. All three are CLOCK_MONOTONIC on Linux: :func:`monotonic` reads the
same seconds as an unpatched ``time.monotonic()``.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable


def _bound() -> Callable[[], int]:
    for name in ("monotonic_ns", "perf_counter_ns"):
        clock = getattr(time, name, None)
        if isinstance(clock, types.BuiltinFunctionType):
            return clock
    gettime, which = time.clock_gettime_ns, time.CLOCK_MONOTONIC
    return lambda: gettime(which)


#: Nanoseconds on the monotonic clock (an int).
monotonic_ns: Callable[[], int] = _bound()


def monotonic() -> float:
    """Seconds on the monotonic clock (what ``time.monotonic()`` reads when nothing patched it)."""
    return monotonic_ns() / 1e9


#: ``time.sleep`` as it was at import (a test's patch of it changes nothing of perfhooks' waits).
sleep: Callable[[float], None] = time.sleep
