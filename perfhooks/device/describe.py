"""The host's processor, for the report's ``device`` on a CPU run."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cpus() -> int | None:
    """The CPUs this process may run on (its affinity, as a job scheduler or ``taskset`` set it), else the
    machine's count; None when unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (a framework's), or None (not installed, or not one)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except (metadata.PackageNotFoundError, ValueError):
        return None
