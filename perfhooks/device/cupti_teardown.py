"""CUPTI let go after a window: Kineto's ``TEARDOWN_CUPTI``, set while a run lasts where torch deems it safe.

A ``torch.profiler`` window with CUDA activity attaches CUPTI to the process. Unless ``TEARDOWN_CUPTI=1`` is in the
environment when the window stops, Kineto leaves it attached, and every kernel launch after the window pays for
it. On an H100 (torch 2.11, CUDA 13.0), the 135M GPT of ``benchmarks/gpu_check.py --isolate`` under Lightning ran
its steady steps at 48.4 ms after perfhooks' default window, 35.9 ms with the variable set and 34.3 ms bare. A bare
``torch.profiler`` window left 41.8 ms behind (pytorch/pytorch#144455; kineto#1264, for CUDA 12.6 and newer,
and the open kineto#1539 propose teardown as Kineto's default).

Kineto reads the variable when a trace stops (to tear down), after the teardown (to re-create its callbacks
lazily or at once) and when the next trace starts. Torch turns teardown off (``"0"``) for CUDA graphs where a
re-init after it can crash: CUDA older than 12.6, or its ``profiler_allow_cudagraph_cupti_lazy_reinit_cuda12``
switch off. perfhooks sets ``"1"`` only where none of that applies and the variable is not set at all: a value
the user or torch chose stays. At the run's close it deletes the variable again if it still holds perfhooks'
``"1"`` (a delete moves no memory that a concurrent ``getenv`` could be reading).
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping

#: The variable Kineto reads.
VARIABLE = "TEARDOWN_CUPTI"
#: The CUDA version from which torch lets CUPTI be torn down and re-initialised with CUDA graphs.
SAFE_FROM_CUDA = (12, 6)
_ENVIRON = os.environ


def _cuda_version() -> tuple[int, ...] | None:
    """The CUDA version torch was built with (its CUPTI's), as numbers; None on a CPU or ROCm build."""
    import torch

    version = getattr(torch.version, "cuda", None)
    if not version or getattr(torch.version, "hip", None):
        return None
    try:
        return tuple(int(part) for part in str(version).split(".")[:2])
    except ValueError:
        return None


def teardown_is_safe(environ: MutableMapping[str, str] = _ENVIRON) -> bool:
    """Whether torch itself would tear CUPTI down with CUDA graphs in the process: CUDA 12.6 or newer, lazy
    re-init not disabled (``DISABLE_CUPTI_LAZY_REINIT``), and torch's switch for it on."""
    version = _cuda_version()
    if version is None or version < SAFE_FROM_CUDA or environ.get("DISABLE_CUPTI_LAZY_REINIT"):
        return False
    try:
        from torch._utils_internal import profiler_allow_cudagraph_cupti_lazy_reinit_cuda12 as allowed
    except ImportError:
        return False
    try:
        return bool(allowed())
    except Exception:
        return False


def detaches_after_windows(environ: MutableMapping[str, str] = _ENVIRON) -> bool:
    """Whether Kineto will let CUPTI go after a run's windows: ``TEARDOWN_CUPTI=1`` already, or unset where
    :class:`CuptiTeardown` sets it."""
    return environ.get(VARIABLE) == "1" or (VARIABLE not in environ and teardown_is_safe(environ))


class CuptiTeardown:
    """Sets ``TEARDOWN_CUPTI=1`` before a run's first CUDA window, and takes it away at the run's close."""

    def __init__(self, environ: MutableMapping[str, str] = _ENVIRON,
                 safe: Callable[[MutableMapping[str, str]], bool] = teardown_is_safe) -> None:
        self.environ = environ
        self.safe = safe
        #: Whether the variable now in the environment is the one this run set.
        self.armed = False

    def arm(self) -> bool:
        """Before a window with CUDA activity starts; whether Kineto will let CUPTI go when it stops."""
        if not self.armed and VARIABLE not in self.environ and self.safe(self.environ):
            self.environ[VARIABLE] = "1"
            self.armed = True
        return self.environ.get(VARIABLE) == "1"

    def release(self) -> None:
        """At the run's close: the variable goes if it still holds this run's ``"1"`` (torch may have changed it)."""
        if self.armed:
            self.armed = False
            if self.environ.get(VARIABLE) == "1":
                del self.environ[VARIABLE]
