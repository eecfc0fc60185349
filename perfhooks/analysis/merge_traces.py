"""Merge the ranks' traces of one window into one Chrome trace, one process per rank, clocks aligned.

Each rank's trace keeps its own events; they move to one process per rank (``pid`` = the rank, named
``rank N (host)``) with their threads and streams renumbered inside it, and flow ids made unique per rank.

**Clocks.** Kineto writes wall-clock microseconds less ``baseTimeNanoseconds``: traces from one host share
a clock, traces from different hosts differ by their clocks' offset (NTP keeps it near a millisecond, not
near a microsecond). Each rank's offset to the lowest rank is estimated from a moment all ranks share:

1. ``collective_end``: a collective ends at the same moment on every rank of its group. The k-th collective
   of a name in step N (NCCL/RCCL kernels on the device, else gloo's host ranges) is matched across ranks,
   and the offset is the median of the differences of their ends;
2. ``step_start``: with no collective to match, the start of the same ``ProfilerStep#N`` (each step starts
   after the previous one's collectives);
3. otherwise the rank is left unshifted, with a warning.

Ranks on the same host as the reference are not shifted (their clock is the same); the estimate is still
written. Every rank's offset, method and spread are in the merged trace's ``perfhooksMerge`` metadata,
which is also what lets ``perfhooks analyze`` split the file back into the ranks' own traces.
"""

from __future__ import annotations

import gzip
import itertools
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from perfhooks.analysis.trace import MERGE_KEY, RANK_IN_NAME, STEP_PREFIX, NotATrace, TraceError, read_trace_json
from perfhooks.analysis.trace_files import find_traces
from perfhooks.files.atomic import atomic_write_bytes

#: The version of what the merged trace's ``perfhooksMerge`` metadata holds.
MERGE_VERSION = 1
_HOST_COLLECTIVE_PREFIXES = ("gloo:", "mpi:", "ucc:")
#: Flow ids are moved into a range per rank: rank * 2**40 + id (ids beyond 2**40 become "rank:id" strings).
_FLOW_STRIDE = 2**40
_FLOW_PHASES = frozenset("stf")


@dataclass
class RankTrace:
    """One rank's trace as read from its file: the raw document, its rank, host and clock base."""

    path: str
    rank: int
    host: str | None
    document: dict[str, Any]
    base_us: float = 0.0
    #: ProfilerStep number -> (start, end), µs in the trace's own clock.
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClockOffset:
    """What is added to a rank's timestamps (µs) to put them on the reference rank's clock."""

    applied_us: float
    estimated_us: float | None
    method: str  # "reference", "collective_end", "step_start", "same_host" or "unknown"
    matches: int = 0
    spread_us: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"applied_us": self.applied_us, "estimated_us": self.estimated_us, "method": self.method,
                "matches": self.matches, "spread_us": self.spread_us}


def read_rank_trace(path: str | Path) -> RankTrace:
    """A trace file as a :class:`RankTrace`; its rank from ``distributedInfo`` or ``rank<N>`` in the name."""
    document = read_trace_json(path)
    if isinstance(document, list):
        document = {"traceEvents": document}
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise NotATrace(f"{path}: not a trace (no traceEvents list)")
    if MERGE_KEY in document:
        raise TraceError(f"{path}: already a merged trace; merge the ranks' own traces")
    info = document.get("distributedInfo") if isinstance(document.get("distributedInfo"), dict) else {}
    rank = info.get("rank")
    if not isinstance(rank, int):
        match = RANK_IN_NAME.search(Path(path).name)
        if match is None:
            raise TraceError(f"{path}: cannot tell its rank (no distributedInfo.rank, no rank<N> in the name)")
        rank = int(match.group(1))
    host = document.get("host_name") if isinstance(document.get("host_name"), str) else None
    base = document.get("baseTimeNanoseconds")
    trace = RankTrace(str(path), rank, host, document, base / 1e3 if isinstance(base, (int, float)) else 0.0)
    for event in document["traceEvents"]:
        if type(event) is dict and event.get("ph") == "X":
            name = event.get("name")
            if isinstance(name, str) and name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX):].isdigit():
                ts, dur = event.get("ts"), event.get("dur")
                if isinstance(ts, (int, float)) and isinstance(dur, (int, float)):
                    trace.steps[int(name[len(STEP_PREFIX):])] = (ts, ts + dur)
    return trace


# ----------------------------------------------------------------------------- clock offsets
def _step_of(ts: float, spans: list[tuple[int, float, float]]) -> int | None:
    for number, start, end in spans:
        if start <= ts < end:
            return number
    return None


def collective_ends(trace: RankTrace) -> dict[tuple[int, str, int], float]:
    """``(step, name, k) -> end µs`` for the k-th collective of that name in that step: the device's NCCL/RCCL
    kernels when the trace has any (a kernel's step is its launch's), else gloo/MPI/UCC host ranges."""
    spans = sorted((n, s, e) for n, (s, e) in trace.steps.items())
    events = [e for e in trace.document["traceEvents"] if type(e) is dict and e.get("ph") == "X"
              and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    launches: dict[Any, float] = {}
    device: list[dict[str, Any]] = []
    host: list[dict[str, Any]] = []
    for event in events:
        name = str(event.get("name"))
        category = event.get("cat")
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if category in ("cuda_runtime", "cuda_driver", "Runtime") and "correlation" in args:
            launches[args["correlation"]] = event["ts"]
        elif category in ("kernel", "Kernel") and ("nccl" in name.lower() or "rccl" in name.lower()):
            device.append(event)
        elif category in ("user_annotation", "cpu_op") and name.startswith(_HOST_COLLECTIVE_PREFIXES):
            host.append(event)
    ends: dict[tuple[int, str, int], float] = {}
    counts: dict[tuple[int, str], int] = defaultdict(int)
    if device:
        chosen = [(launches.get((e.get("args") or {}).get("correlation")), e) for e in device]
    else:
        chosen = [(e["ts"], e) for e in host]
    for at, event in sorted(((at, e) for at, e in chosen if at is not None), key=lambda item: item[1]["ts"]):
        step = _step_of(at, spans)
        if step is None:
            continue
        key = (step, str(event["name"]))
        ends[(*key, counts[key])] = event["ts"] + event["dur"]
        counts[key] += 1
    return ends


def estimate_offset(reference: RankTrace, other: RankTrace) -> ClockOffset:
    """The µs to add to ``other``'s timestamps (after the clock bases are made equal) to put them on
    ``reference``'s clock; ``applied_us`` is 0 for a rank on the reference's host."""
    base = other.base_us - reference.base_us
    estimate: tuple[float, str, int, float] | None = None
    mine, theirs = collective_ends(reference), collective_ends(other)
    shared = sorted(set(mine) & set(theirs))
    if shared:
        differences = [mine[key] - (theirs[key] + base) for key in shared]
        estimate = (*_median_and_spread(differences), "collective_end", len(shared))  # type: ignore[assignment]
    else:
        steps = sorted(set(reference.steps) & set(other.steps))
        if steps:
            differences = [reference.steps[n][0] - (other.steps[n][0] + base) for n in steps]
            estimate = (*_median_and_spread(differences), "step_start", len(steps))  # type: ignore[assignment]
    if estimate is None:
        return ClockOffset(0.0, None, "unknown")
    value, spread, method, matches = estimate  # type: ignore[misc]
    if reference.host is not None and reference.host == other.host:
        return ClockOffset(0.0, value, "same_host", matches, spread)
    return ClockOffset(round(value, 3), value, method, matches, spread)


def _median_and_spread(values: list[float]) -> tuple[float, float]:
    """The median, and the median absolute deviation from it (µs)."""
    middle = statistics.median(values)
    return round(middle, 3), round(statistics.median(abs(v - middle) for v in values), 3)


# ----------------------------------------------------------------------------- merging
@dataclass
class MergeResult:
    path: Path
    ranks: list[int]
    steps: list[int]
    offsets: dict[int, ClockOffset]
    warnings: list[str]
    bytes: int


def merge_traces(paths: list[str | Path], output: str | Path, aligned_steps: bool = False,
                 max_bytes: int | None = None, step: int | None = None) -> MergeResult:
    """Merge one window's per-rank traces (files, or folders searched for them) into ``output`` (.json or .json.gz).

    Args:
        paths: trace files or folders; in a folder, each rank's latest perfhooks window (or ``step``'s).
        output: where the merged trace goes (written whole, then renamed into place).
        aligned_steps: keep only the events of the steps every rank recorded (and of nothing between them).
        max_bytes: the most the output may take; steps are dropped from the end until it fits (bytes).
        step: take the windows that start at this step (perfhooks' ``rank<R>.step<N>`` file names).
    """
    files = find_traces(paths, step=step)
    traces: list[RankTrace] = []
    for name in files:
        try:
            traces.append(read_rank_trace(name))
        except NotATrace:  # other JSON in a folder
            if name in map(str, paths):
                raise
    traces.sort(key=lambda t: t.rank)
    if not traces:
        raise TraceError(f"{', '.join(map(str, paths))}: no trace among the files found")
    if len(traces) < 2:
        raise TraceError(f"{', '.join(map(str, paths))}: found the trace of one rank only ({traces[0].path}); "
                         "merge-traces needs two ranks or more")
    for first, second in itertools.pairwise(traces):
        if first.rank == second.rank:
            raise TraceError(f"{first.path} and {second.path} are both rank {first.rank}: give one window per rank "
                             "(--step N picks one)")
    reference = traces[0]
    offsets = {reference.rank: ClockOffset(0.0, 0.0, "reference")}
    warnings: list[str] = []
    for trace in traces[1:]:
        offsets[trace.rank] = estimate_offset(reference, trace)
        if offsets[trace.rank].method == "unknown":
            warnings.append(f"rank {trace.rank}: no collective or step shared with rank {reference.rank}; its clock "
                            "offset is unknown and its events are left unshifted")
    common = sorted(set.intersection(*(set(t.steps) for t in traces)))
    if not common:
        warnings.append("the ranks recorded no ProfilerStep in common: these may not be the same window")
    if aligned_steps and not common:
        raise TraceError("--aligned-steps: the ranks share no ProfilerStep to keep")
    keep = common if aligned_steps else None
    output = Path(output)
    while True:
        size = _write(traces, offsets, output, keep, common, warnings)
        if max_bytes is None or size <= max_bytes:
            break
        kept = keep if keep is not None else common
        if len(kept) <= 1:
            output.unlink(missing_ok=True)
            raise TraceError(f"the merged trace takes {size} bytes with {len(kept) or 'all its'} step(s), more than "
                             f"the {max_bytes} allowed (max_trace_bytes); record a shorter window")
        fewer = max(1, min(len(kept) - 1, int(len(kept) * max_bytes / size)))
        keep = kept[:fewer]
        note = f"kept steps {keep[0]}-{keep[-1]} of {common[0]}-{common[-1]} to stay under {max_bytes} bytes"
        warnings[:] = [w for w in warnings if not w.startswith("kept steps")] + [note]
    return MergeResult(output, [t.rank for t in traces], keep if keep is not None else common, offsets, warnings,
                       size)


def _write(traces: list[RankTrace], offsets: dict[int, ClockOffset], output: Path, keep: list[int] | None,
           common: list[int], warnings: list[str]) -> int:
    """Write the merged document; its size in bytes."""
    base_us = traces[0].base_us
    events: list[Any] = []
    entries = []
    for trace in traces:
        shift = round(trace.base_us - base_us + offsets[trace.rank].applied_us, 3)
        moved, threads = _move_rank(trace, shift, keep)
        events += moved
        info = trace.document.get("distributedInfo")
        entries.append({"rank": trace.rank, "host": trace.host, "pid": trace.rank, "path": trace.path,
                        "shift_us": shift, "clock": offsets[trace.rank].as_dict(), "threads": threads,
                        "world_size": info.get("world_size") if isinstance(info, dict) else None,
                        "distributedInfo": info, "deviceProperties": trace.document.get("deviceProperties"),
                        "steps": sorted(trace.steps)})
    document = {
        "schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": round(base_us * 1e3),
        "traceName": str(output), "deviceProperties": traces[0].document.get("deviceProperties") or [],
        MERGE_KEY: {"version": MERGE_VERSION, "ranks": entries, "common_steps": common,
                    "kept_steps": keep if keep is not None else "all", "warnings": list(warnings)},
        "traceEvents": events,
    }
    data = msgspec.json.encode(document)
    atomic_write_bytes(output, gzip.compress(data, compresslevel=6) if output.name.endswith(".gz") else data)
    return output.stat().st_size


def _label(trace: RankTrace) -> str:
    return f"rank {trace.rank} ({trace.host})" if trace.host else f"rank {trace.rank}"


def _move_rank(trace: RankTrace, shift_us: float, keep: list[int] | None) -> tuple[list[Any], list[list[Any]]]:
    """The rank's events in its merged process, shifted by ``shift_us``; and ``[tid, original pid, original tid]``
    for each of its threads and streams."""
    raw = trace.document["traceEvents"]
    bounds = None
    if keep:
        spans = [trace.steps[n] for n in keep]
        bounds = (min(s for s, _ in spans), max(e for _, e in spans))
    names: dict[tuple[Any, Any], str] = {}
    labels: dict[Any, str] = {}
    for event in raw:
        if type(event) is dict and event.get("ph") == "M" and isinstance(event.get("args"), dict):
            key = (event.get("pid"), event.get("tid"))
            if event.get("name") == "thread_name":
                names[key] = str(event["args"].get("name"))
            elif event.get("name") == "process_labels":
                labels[event.get("pid")] = str(event["args"].get("labels"))
    tids: dict[tuple[Any, Any], int] = {}
    out: list[Any] = []
    for event in raw:
        if type(event) is not dict or event.get("ph") == "M":
            continue
        ts = event.get("ts")
        if bounds is not None and isinstance(ts, (int, float)):
            end = ts + event["dur"] if isinstance(event.get("dur"), (int, float)) else ts
            if end < bounds[0] or ts > bounds[1]:
                continue
        key = (event.get("pid"), event.get("tid"))
        tid = tids.get(key)
        if tid is None:
            tid = tids[key] = len(tids) + 1
        moved = dict(event)
        moved["pid"], moved["tid"] = trace.rank, tid
        if isinstance(ts, (int, float)) and shift_us:
            moved["ts"] = round(ts + shift_us, 3)
        if event.get("ph") in _FLOW_PHASES and "id" in event:
            moved["id"] = _flow_id(trace.rank, event["id"])
        out.append(moved)
    label = _label(trace)
    meta: list[Any] = [{"ph": "M", "name": "process_name", "pid": trace.rank, "tid": 0, "args": {"name": label}},
                       {"ph": "M", "name": "process_sort_index", "pid": trace.rank, "tid": 0,
                        "args": {"sort_index": trace.rank}}]
    threads = []
    for (pid, tid), new in tids.items():
        name = names.get((pid, tid)) or f"thread {tid}"
        if pid in labels and labels[pid] != "CPU":
            name = f"{labels[pid]} {name}"  # "GPU 0 stream 7"
        meta.append({"ph": "M", "name": "thread_name", "pid": trace.rank, "tid": new, "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": trace.rank, "tid": new,
                     "args": {"sort_index": new}})
        threads.append([new, pid, tid])
    return meta + out, threads


def _flow_id(rank: int, value: Any) -> Any:
    if isinstance(value, int) and 0 <= value < _FLOW_STRIDE:
        return rank * _FLOW_STRIDE + value
    return f"{rank}:{value}"
