"""The process's settings that slow training, read as they stand: the settings audit's facts.

Read at the run's start and again at each full publication of the run's state (a window's end, the periodic
report, the close), never per step: each read is a few C calls, environment lookups and two small ``/proc``
files (about 30 µs). Nothing here changes a setting. The rules that turn these facts into verdicts are
:mod:`perfhooks.rules.settings`; ``report.json``'s ``settings`` section is :meth:`SettingsAudit.section`.

The torch functions are bound once, at import: a user's test that patches ``torch.is_anomaly_enabled`` changes
nothing here.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from perfhooks.device import matmul_speed
from perfhooks.device.describe import usable_cpus

_anomaly: Callable[[], bool] = torch.is_anomaly_enabled
_anomaly_nan: Callable[[], bool] | None = getattr(torch, "is_anomaly_check_nan_enabled", None)
_threads: Callable[[], int] = torch.get_num_threads
_deterministic: Callable[[], bool] = torch.are_deterministic_algorithms_enabled
_profiler_on: Callable[[], bool] | None = getattr(getattr(getattr(torch, "_C", None), "_autograd", None),
                                                  "_profiler_enabled", None)
_cpu = getattr(torch, "cpu", None)
_avx512_bf16: Callable[[], bool] | None = getattr(_cpu, "_is_avx512_bf16_supported", None)
_amx: Callable[[], bool] | None = getattr(_cpu, "_is_amx_tile_supported", None)
_process_time: Callable[[], float] = time.process_time
_monotonic: Callable[[], float] = time.monotonic

#: Environment variables that debugging leaves behind, with the values that slow a run: ``None`` for any value
#: but ``0``/empty. Each is named in the ``debug_switches`` verdict with what it costs.
DEBUG_ENVIRONMENT: dict[str, tuple[str, ...] | None] = {
    "CUDA_LAUNCH_BLOCKING": None,
    "PYTORCH_NO_CUDA_MEMORY_CACHING": None,
    "TORCH_USE_CUDA_DSA": None,
    "NCCL_DEBUG": ("INFO", "TRACE"),
    "TORCH_LOGS": None,
    "TORCHDYNAMO_VERBOSE": None,
    "TORCH_SHOW_CPP_STACKTRACES": None,
}

#: The variables that set the intra-op threads' default.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: USER_HZ: the unit of ``/proc/stat``'s CPU times (100 on every Linux build torch supports).
CLOCK_TICKS = 100
#: Wall time (s) the host's share needs: ``/proc/stat`` counts in 10 ms ticks.
MIN_WALL_S = 0.1


def debug_environment(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The debugging switches set in ``environ``, by name, as set."""
    found = {}
    for name, values in DEBUG_ENVIRONMENT.items():
        value = environ.get(name, "").strip()
        if not value or value == "0":
            continue
        if values is None or value.upper() in values:
            found[name] = value
    return found


def faster_cpu_type() -> str | None:
    """``"amx"`` or ``"avx512_bf16"`` where this CPU runs bf16 matmuls natively (torch's own CPU checks), else
    None."""
    try:
        if _amx is not None and _amx():
            return "amx"
        if _avx512_bf16 is not None and _avx512_bf16():
            return "avx512_bf16"
    except Exception:  # a torch build without the check: nothing is said
        return None
    return None


def busy_cpu_s(cpus: Iterable[int] | None, path: str = "/proc/stat") -> float | None:
    """CPU seconds the machine's ``cpus`` (all, when None) spent busy since boot (user, nice, system, irq,
    softirq and steal; ``/proc/stat``); None where it cannot be read."""
    wanted = None if cpus is None else {f"cpu{index}" for index in cpus}
    try:
        with open(path) as stat:
            ticks = 0
            for line in stat:
                if not line.startswith("cpu"):
                    break
                name, *fields = line.split()
                if (name == "cpu") != (wanted is None) or (wanted is not None and name not in wanted):
                    continue
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
                ticks += user + nice + system + irq + softirq + steal
            return ticks / CLOCK_TICKS
    except (OSError, ValueError):
        return None


class HostShare:
    """How much of this process's CPUs other processes used since the run's start: the machine's busy time on
    those CPUs less this process's own CPU time, over the wall time and the CPUs (``/proc/stat``).

    ``clock``, ``own_cpu_s`` and ``busy_s`` are injectable for tests (seconds)."""

    def __init__(self, cpus: int | None, clock: Callable[[], float] = _monotonic,
                 own_cpu_s: Callable[[], float] = _process_time,
                 busy_s: Callable[[], float | None] | None = None) -> None:
        self.cpus = cpus
        affinity = _affinity()
        self.clock, self.own_cpu_s = clock, own_cpu_s
        self.busy_s = busy_s or (lambda: busy_cpu_s(affinity))
        self.start = (clock(), own_cpu_s(), self.busy_s())

    def read(self) -> dict[str, float] | None:
        """``{"wall_s", "others_share"}`` since the start (others' CPU seconds over wall x CPUs, 0..1), or None
        where ``/proc/stat`` is not readable, the CPUs are unknown or under :data:`MIN_WALL_S` passed."""
        wall0, own0, busy0 = self.start
        busy = self.busy_s()
        if busy is None or busy0 is None or not self.cpus:
            return None
        wall = self.clock() - wall0
        if wall < MIN_WALL_S:
            return None
        others = max(0.0, (busy - busy0) - (self.own_cpu_s() - own0))
        return {"wall_s": round(wall, 3), "others_share": round(min(1.0, others / (wall * self.cpus)), 4)}


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


class SettingsAudit:
    """The run's settings, read at its start and at each full publication (training thread). A setting seen on
    at any read stays in the audit (``since``: the step it was first seen at)."""

    def __init__(self, room: Any, host: HostShare | None = None,
                 environ: dict[str, str] | os._Environ[str] = os.environ,
                 workers: Callable[[], int] | None = None) -> None:
        """``workers``: the most DataLoader worker processes the run's loaders used so far (the runtime's count)."""
        self.room = room
        self.workers = workers
        self.environ = environ
        cpus = usable_cpus()
        self.host = host or HostShare(cpus)
        self.usable_cpus = cpus
        self.cpu_type = None if room.accelerated else faster_cpu_type()
        #: The models the run watches (weakly: the audit keeps none alive), for their parameters' dtype.
        self.models: weakref.WeakSet[Any] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Forwards inside a marked evaluation that ran with grad enabled (building autograd graphs), counted by
        #: the runtime's evaluation probe.
        self.evaluation_graphs = 0
        #: First step each switch was seen on at (``anomaly_detection``, ``profiler``, ...).
        self.since: dict[str, int] = {}
        self.latest: dict[str, Any] = {}
        #: fp32 against bf16 on the run's own matmul shapes (:mod:`perfhooks.device.matmul_speed`), measured once.
        self.matmul_speed: dict[str, Any] | None = None
        self._speed_tried = False
        self.read(0, window_open=False)

    def read(self, step: int, window_open: bool, rows: int = 0) -> dict[str, Any]:
        """The settings now (``window_open``: perfhooks' own profiler window records, so a profiler that is on
        is its own and is not looked at; ``rows``: the rows, tokens or samples, a micro-batch takes, once known:
        a CPU run's matmuls are then timed in fp32 and bf16, once)."""
        facts: dict[str, Any] = {
            "anomaly_detection": bool(_anomaly()),
            "anomaly_check_nan": bool(_anomaly_nan()) if _anomaly_nan is not None else None,
            "intra_op_threads": int(_threads()),
            "usable_cpus": self.usable_cpus,
            "deterministic_algorithms": bool(_deterministic()),
            "environment": debug_environment(self.environ),
            "environment_threads": {name: self.environ[name] for name in THREAD_VARIABLES if name in self.environ},
            "ranks_on_host": _int(self.environ.get("LOCAL_WORLD_SIZE"), 1),
            "param_dtypes": self.param_dtypes(),
            "loader_workers": self.workers() if self.workers is not None else None,
            "evaluation_grad_forwards": self.evaluation_graphs,
            "foreach_off": self.foreach_off(),
            "faster_cpu_type": self.cpu_type,
        }
        if not window_open and _profiler_on is not None:
            facts["profiler_running"] = bool(_profiler_on())
        elif "profiler_running" in self.latest:
            facts["profiler_running"] = self.latest["profiler_running"]
        if self.room.is_cuda:
            facts.update(self.room.cuda_settings())
        host = self.host.read()
        if host is not None:
            facts["host"] = host
        if rows > 0 and not self._speed_tried and not self.room.accelerated and len(self.models):
            self._speed_tried = True
            self.matmul_speed = matmul_speed.measure(list(self.models), rows)
        if self.matmul_speed is not None:
            facts["matmul_speed"] = self.matmul_speed
        for name in ("anomaly_detection", "deterministic_algorithms", "profiler_running"):
            if facts.get(name):
                self.since.setdefault(name, step)
        if facts["intra_op_threads"] and self.usable_cpus and facts["intra_op_threads"] != self.usable_cpus:
            self.since.setdefault("threads", step)
        self.latest = facts
        return self.section()

    def watch(self, trained: Any) -> None:
        """A model the run trains (its first floating parameter's dtype is read at each read), or an optimizer it
        steps (its ``foreach`` and its parameters are read)."""
        try:
            if isinstance(trained, torch.optim.Optimizer) or hasattr(trained, "param_groups"):
                self.optimizers.add(trained)
            elif callable(getattr(trained, "parameters", None)):
                self.models.add(trained)
        except TypeError:  # not weakly referable (``__slots__`` without ``__weakref__``): nothing to read
            pass
        # anything else (an optimizer-like object of a framework's, with a step and no parameters) has nothing to say

    def foreach_off(self) -> list[dict[str, Any]]:
        """The watched optimizers built with ``foreach=False``: ``{optimizer, tensors}`` each."""
        found = []
        for optimizer in list(self.optimizers):
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps one
            if getattr(inner, "defaults", {}).get("foreach") is False:
                tensors = sum(len(group.get("params", ())) for group in getattr(inner, "param_groups", ()))
                found.append({"optimizer": type(inner).__name__, "tensors": tensors})
        return found

    def param_dtypes(self) -> list[str]:
        """The watched models' first floating parameter dtype each (``float32``, ``bfloat16``), sorted."""
        found = set()
        for model in list(self.models):
            for parameter in model.parameters():
                if parameter.is_floating_point():
                    found.add(str(parameter.dtype).removeprefix("torch."))
                    break
        return sorted(found)

    def section(self) -> dict[str, Any]:
        """``report.json``'s ``settings``: the latest read, and the step each switch was first seen on at."""
        return {**self.latest, "since": dict(self.since)}
