"""perfhooks merge-traces on real GPU traces: one process per rank, clocks aligned from NCCL kernel ends.

The shared traces hold one rank of each run, so a second rank is the same trace moved to another host whose
clock is off by a known amount: the offset found must be exactly that amount, from the NCCL kernels' ends
(the raw events are counted in the test), and analyze must read the merged file as the two ranks' own traces.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfhooks.analysis.merge_traces import collective_ends, merge_traces, read_rank_trace
from perfhooks.analysis.trace import TraceError, load_trace, load_traces
from perfhooks.offline.analyze import analyze_paths

DATA = Path(__file__).resolve().parents[1] / "data" / "traces" / "hta"
NCCL = DATA / "a100_nccl_rank0_of2.json.gz"
SHIFT_US = 1234.567  # a clock 1.23 ms ahead


def _second_rank(tmp_path: Path, source: Path = NCCL, host: str = "node-b", shift_us: float = SHIFT_US) -> Path:
    """``source`` as rank 1 on ``host``, its clock ``shift_us`` ahead."""
    document = json.loads(gzip.decompress(source.read_bytes()))
    document["distributedInfo"] = {**document.get("distributedInfo", {}), "rank": 1}
    document["host_name"] = host
    for event in document["traceEvents"]:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = round(event["ts"] + shift_us, 3)
    path = tmp_path / "rank1.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def test_the_nccl_kernels_ends_are_the_shared_moments() -> None:
    raw = json.loads(gzip.decompress(NCCL.read_bytes()))["traceEvents"]
    nccl = [e for e in raw if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")]
    assert len(nccl) == 21  # 15 all-reduces and 6 broadcasts
    ends = collective_ends(read_rank_trace(NCCL))
    # those launched inside a ProfilerStep, each keyed by step, kernel name and rank in the step
    assert 0 < len(ends) <= len(nccl)
    assert set(ends.values()) <= {e["ts"] + e["dur"] for e in nccl}


def test_a_known_clock_offset_is_recovered_exactly(tmp_path: Path) -> None:
    other = _second_rank(tmp_path)
    result = merge_traces([NCCL, other], tmp_path / "merged.json.gz")
    offset = result.offsets[1]
    assert offset.method == "collective_end" and offset.matches >= 10
    assert offset.applied_us == pytest.approx(-SHIFT_US, abs=1e-3) and offset.spread_us == pytest.approx(0, abs=1e-3)
    document = json.loads(gzip.decompress((tmp_path / "merged.json.gz").read_bytes()))
    meta = document["perfhooksMerge"]
    assert [entry["clock"]["applied_us"] for entry in meta["ranks"]] == [0.0, offset.applied_us]
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1 (node-b)"}  # the 2024 trace names no host
    # after the shift, the same kernel ends at the same time on both ranks
    kernel_ends = {}
    for event in document["traceEvents"]:
        if event.get("cat") == "kernel" and event["name"].startswith("ncclKernel"):
            kernel_ends.setdefault(event["pid"], []).append(round(event["ts"] + event["dur"], 3))
    assert kernel_ends[0] == pytest.approx(kernel_ends[1], abs=1e-3)
    flows = [e for e in document["traceEvents"] if e.get("ph") in ("s", "f")]
    assert len({(e["ph"], e["id"]) for e in flows}) == len(flows)  # flow ids unique across the ranks


def test_ranks_of_one_host_are_not_shifted(tmp_path: Path) -> None:
    """Same host, same clock: the estimate is written, nothing is applied."""
    other = _second_rank(tmp_path, host="node-a", shift_us=0.0)
    original = json.loads(gzip.decompress(NCCL.read_bytes()))
    original["host_name"] = "node-a"
    first = tmp_path / "rank0.json.gz"
    first.write_bytes(gzip.compress(json.dumps(original).encode()))
    offset = merge_traces([first, other], tmp_path / "merged.json").offsets[1]
    assert (offset.method, offset.applied_us, offset.estimated_us) == ("same_host", 0.0, 0.0)


def test_analyze_reads_the_merged_trace_as_the_ranks_own(tmp_path: Path) -> None:
    other = _second_rank(tmp_path)
    merged = tmp_path / "merged.json.gz"
    merge_traces([NCCL, other], merged)
    ranks = load_traces(merged)
    assert [t.rank for t in ranks] == [0, 1] and [t.world_size for t in ranks] == [2, 2]
    original = load_trace(NCCL)
    for trace in ranks:  # each rank's events back on its own pids, tids and clock (rank 1's file is SHIFT_US ahead)
        shift = SHIFT_US if trace.rank == 1 else 0.0
        assert len(trace.kernels) == len(original.kernels)
        assert [n for n, _, _ in trace.steps] == [n for n, _, _ in original.steps]
        assert [s for _, s, _ in trace.steps] == pytest.approx([s + shift for _, s, _ in original.steps], abs=1e-3)
        assert {(k.pid, k.tid) for k in trace.kernels} == {(k.pid, k.tid) for k in original.kernels}
    from_merged, from_files = analyze_paths([merged]), analyze_paths([NCCL, other])
    assert from_merged["ranks"]["step_ms"] == from_files["ranks"]["step_ms"]
    assert [d["id"] for d in from_merged["diagnoses"]] == [d["id"] for d in from_files["diagnoses"]]
    with pytest.raises(TraceError, match="merged trace of 2 ranks"):
        load_trace(merged)


def test_aligned_steps_and_the_byte_cap(tmp_path: Path) -> None:
    other = _second_rank(tmp_path)
    whole = merge_traces([NCCL, other], tmp_path / "whole.json.gz")
    aligned = merge_traces([NCCL, other], tmp_path / "aligned.json.gz", aligned_steps=True)
    assert aligned.steps == whole.steps and aligned.bytes < whole.bytes
    capped = merge_traces([NCCL, other], tmp_path / "capped.json.gz", aligned_steps=True,
                          max_bytes=int(aligned.bytes * 0.7))
    assert capped.bytes <= aligned.bytes * 0.7 and len(capped.steps) < len(aligned.steps)
    assert any(w.startswith("kept steps") for w in capped.warnings)
    with pytest.raises(TraceError, match="more than the 1000 allowed"):
        merge_traces([NCCL, other], tmp_path / "tiny.json.gz", max_bytes=1000)
    assert not (tmp_path / "tiny.json.gz").exists()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "perfhooks", "merge-traces", *args], capture_output=True,
                              text=True, timeout=60)

    one = run(str(NCCL), "-o", str(tmp_path / "m.json.gz"))
    assert one.returncode == 2 and "needs two ranks or more" in one.stderr and len(one.stderr.splitlines()) == 1
    same = run(str(NCCL), str(NCCL), "-o", str(tmp_path / "m.json.gz"))
    assert same.returncode == 2 and "are both rank 0" in same.stderr
    cap = run(str(NCCL), "-o", str(tmp_path / "m.json.gz"), "--max-bytes", "0")
    assert cap.returncode == 2 and "--max-bytes must be a positive number of bytes" in cap.stderr
    missing = run(str(tmp_path / "nope"), "-o", str(tmp_path / "m.json.gz"))
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr


def _foreign_merge(tmp_path: Path, sources: list[Path], offset_pids: bool) -> tuple[Path, list[Path]]:
    """The ranks' files merged as other tools write them: every event carries ``args.rank``, and (TraceLens's
    TraceFusion) each rank's pids, host and device, are offset by 10**8 per rank; no ``deviceProperties``. Also
    each rank's own file, with the same events and no ``deviceProperties``, for comparison."""
    merged_events, own_files = [], []
    for rank, source in enumerate(sources):
        document = json.loads(gzip.decompress(source.read_bytes()))
        document.pop("deviceProperties", None)
        document["distributedInfo"] = {"rank": rank, "world_size": len(sources)}
        own = tmp_path / f"own_rank{rank}.json"
        own.write_text(json.dumps(document))
        own_files.append(own)
        for event in document["traceEvents"]:
            event = dict(event)
            event["args"] = {**(event.get("args") or {}), "rank": rank}
            if offset_pids and isinstance(event.get("pid"), int):
                event["pid"] += rank * 100_000_000
            merged_events.append(event)
    merged = tmp_path / ("tracelens_merged.json" if offset_pids else "rank_args_merged.json")
    merged.write_text(json.dumps({"traceEvents": merged_events}))
    return merged, own_files


@pytest.mark.parametrize("offset_pids", [True, False], ids=["tracelens_pid_offset", "args_rank_only"])
def test_a_merged_file_of_other_tools_is_read_as_its_ranks(tmp_path: Path, offset_pids: bool) -> None:
    """Issue 40, class 1: before, a merged file was one rank: steps of every rank counted together (6 here for
    3 per rank), world size 1, communication overlap measured against other ranks' compute."""
    sources = [NCCL, DATA / "a100_80gb_rank0_of16.json.gz"]
    merged, own_files = _foreign_merge(tmp_path, sources, offset_pids)
    raw = json.loads(merged.read_text())["traceEvents"]
    steps_per_rank = {r: sum(1 for e in raw if e.get("args", {}).get("rank") == r
                             and str(e.get("name", "")).startswith("ProfilerStep#")) for r in (0, 1)}
    assert steps_per_rank == {0: 3, 1: 5}  # by hand, from the raw events
    ranks = load_traces(merged)
    assert [(t.rank, t.world_size, len(t.steps)) for t in ranks] == [(0, 2, 3), (1, 2, 5)]
    for trace, own in zip(ranks, own_files, strict=True):
        original = load_trace(own)
        assert len(trace.kernels) == len(original.kernels)
        assert {(k.pid, k.tid) for k in trace.kernels} == {(k.pid, k.tid) for k in original.kernels}
    from_merged, from_files = analyze_paths([merged]), analyze_paths(own_files)
    assert from_merged["ranks"]["step_ms"] == from_files["ranks"]["step_ms"]
    assert from_merged["ranks"]["count"] == from_merged["ranks"]["expected"] == 2
    assert from_merged["world_size"] == 2
    assert [d["id"] for d in from_merged["diagnoses"]] == [d["id"] for d in from_files["diagnoses"]]
    def figures(report: dict) -> list[dict]:
        return [{k: v for k, v in rank.items() if k != "path"} for rank in report["ranks"]["per_rank"]]

    assert figures(from_merged) == figures(from_files)  # the same figures, rank by rank
