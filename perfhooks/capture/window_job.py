"""A window's trace, analysed on the writer thread after its export.

A small trace (at most :data:`IN_PROCESS_MAX_BYTES` on disk, gzipped; a CPU run's window is 10-100 KB) is
analysed in the training process: a few ms, where starting a Python child costs about 0.2 s, which a short run
pays at its close and a fast one in the steps it overlaps. A larger one (a GPU window) would hold the GIL for
a second or so and slow the steps it overlaps, so it goes to a separate interpreter (``perfhooks analyze``,
which imports no torch) at the lowest CPU priority (``SCHED_IDLE`` from its start where ``chrt`` exists, else
``nice`` while it starts: it runs on CPU time the steps leave idle), beside training rather than in its way. The
ranks of a node take turns (:func:`node_lock`): one analysis process per node at a time, so the memory a window's
analysis needs (peak RSS 2-3x the trace's uncompressed JSON) is paid once per node, not once per rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from perfhooks.timebase import monotonic

#: The figures of a window's analysis that go into its record (the GPU ones to W&B too; the collective time
#: to the straggler rule).
WINDOW_METRICS = ("gpu_utilization", "sm_efficiency", "achieved_occupancy", "collective_ms_per_step")
#: Operators and kernels kept in a window's record.
TOP_WORK = 5


#: Gzipped trace bytes up to which a window is analysed in the training process (about 2.5 MB of JSON, a few ms).
#: A larger one is analysed in a child process: parsing it here would leave the training process's heap tens of MB
#: larger for the rest of the run (Python's small-object arenas keep what a few survivors pin).
IN_PROCESS_MAX_BYTES = 1 << 18
#: How much lower the analysis child's CPU priority is (``nice`` increment).
CHILD_NICENESS = 10


def analysis_command(path: Path, thresholds: Any, last_step_share: float | None = None) -> list[str]:
    """The child's command line: on idle CPU from its exec on (``chrt --idle 0``: its interpreter's start and
    imports too, about 0.4 s of CPU that a nice of 10 still took from a 2-core job's steps), else at a nice of
    :data:`CHILD_NICENESS` until ``--idle`` asks for ``SCHED_IDLE`` itself."""
    command = [sys.executable, "-m", "perfhooks", "analyze", str(path), "--format", "json", "--idle",
               "--thresholds", json.dumps(dataclasses.asdict(thresholds))]
    if last_step_share is not None:
        command += ["--last-step-share", repr(last_step_share)]
    chrt = shutil.which("chrt") if sys.platform.startswith("linux") else None
    if chrt:
        return [chrt, "--idle", "0", *command]
    nice = shutil.which("nice")
    return [nice, "-n", str(CHILD_NICENESS), *command] if nice else command


#: The node-local lock file: at most one window analysis of this user's runs at a time on a machine (every rank
#: of the node analyses its window at the same moment; each analysis needs 2-3x its trace's JSON size in memory).
#: Per user: a file another user made in the shared temp folder could not be opened, nor should their runs
#: hold up this one.
LOCK_FILE = "perfhooks-analysis.{uid}.lock"
#: Seconds between two tries at the lock while another analysis holds it.
LOCK_POLL_S = 0.2


@contextlib.contextmanager
def node_lock(timeout_s: float) -> Iterator[bool]:
    """Hold this user's analysis lock on the node (``fcntl.flock`` on a file in the temp folder, which is
    node-local), waiting at most ``timeout_s`` seconds; yields whether it is held. Past the wait the analysis
    runs anyway: the lock only spreads the node's memory peaks, it must not hold a run's report back. Without
    ``fcntl`` (not POSIX), no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield False
        return
    path = Path(tempfile.gettempdir()) / LOCK_FILE.format(uid=os.getuid())
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    held = False
    try:
        deadline = monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if monotonic() >= deadline:
                    break
                time.sleep(LOCK_POLL_S)
        yield held
    finally:
        if held:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


def analyze_window(path: Path, thresholds: Any, first_step: int, timeout_s: float = 600.0,
                   partial_step: dict[str, int] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(metrics for the window record, diagnoses tagged with the window's first step)``; raises on failure.
    ``partial_step``: the window stopped inside its last step (its record's ``{recorded_micro_batches,
    micro_batches}``): that step weighs the share of its micro-batches it recorded."""
    share = (partial_step["recorded_micro_batches"] / partial_step["micro_batches"]
             if partial_step and partial_step.get("micro_batches") else None)
    if path.stat().st_size <= IN_PROCESS_MAX_BYTES:
        result = analyze_in_process(path, thresholds, share)
    else:
        with node_lock(timeout_s / 2):
            done = subprocess.run(analysis_command(path, thresholds, share), capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
        result = json.loads(done.stdout)
    metrics = result["metrics"]
    diagnoses = result["diagnoses"]
    for diagnosis in diagnoses:
        diagnosis["step"] = first_step
    return {**{key: metrics.get(key) for key in WINDOW_METRICS}, **top_work(metrics)}, diagnoses


def analyze_in_process(path: Path, thresholds: Any, last_step_share: float | None = None) -> dict[str, Any]:
    """What ``perfhooks analyze PATH --format json`` prints, as JSON reads it back, computed here."""
    from perfhooks.analysis.trace import load_trace
    from perfhooks.offline.analyze import analyze_trace

    return json.loads(json.dumps(analyze_trace(load_trace(path), thresholds, last_step_share)))


def top_work(metrics: dict[str, Any], top: int = TOP_WORK) -> dict[str, list[dict[str, Any]]]:
    """The window's top operators (device time where the trace has a device, else host time) and top kernels:
    name, ms per step and share 0..1 of the step."""
    steps = max(metrics.get("steps") or 1, 1)
    step_us = metrics.get("step_us") or 0.0

    def row(name: str, total_us: float, **extra: Any) -> dict[str, Any]:
        per_step = total_us / steps
        return {"name": name, "ms_per_step": round(per_step / 1e3, 4),
                "share": round(per_step / step_us, 4) if step_us else None, **extra}

    operators = [row(op["name"], op["time_us"], input_shapes=op.get("input_shapes") or "")
                 for op in (metrics.get("top_operators") or [])[:top]]
    kernels = [row(k["name"], k["total_us"]) for k in ((metrics.get("kernels") or {}).get("top") or [])[:top]]
    return {"top_operators": operators, "top_kernels": kernels}
