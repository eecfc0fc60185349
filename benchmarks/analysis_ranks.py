"""``perfhooks analyze`` over a folder of N ranks' traces: serial (one process) against the machine's cores.

    python benchmarks/analysis_ranks.py [TRACE] [--ranks 8] [--repeats 2]

The trace (default: tests/data/traces/hta/a100_nccl_rank0_of2.json.gz) is copied N times into a temporary folder,
each copy saying its own rank (``distributedInfo``). Prints the best wall time of each way, their ratio (target:
at most 0.6 on 2 cores for 8 ranks), and whether the merged reports' verdicts are the same.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "tests" / "data" / "traces" / "hta" / "a100_nccl_rank0_of2.json.gz"


def write_ranks(trace: Path, folder: Path, ranks: int) -> None:
    document = json.loads(gzip.decompress(trace.read_bytes()) if trace.name.endswith(".gz") else trace.read_bytes())
    for rank in range(ranks):
        document["distributedInfo"] = {**(document.get("distributedInfo") or {}), "rank": rank, "world_size": ranks}
        (folder / f"rank{rank}.trace.json.gz").write_bytes(gzip.compress(json.dumps(document).encode(), 1))


def verdicts(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(d.get("rule"), d.get("severity"), d.get("title"), d.get("ranks")) for d in report.get("diagnoses", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    from perfhooks.offline.analyze import analyze_paths

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_ranks(args.trace, folder, args.ranks)
        times: dict[str, float] = {}
        reports: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeats):  # interleaved, so that a slow spell of the machine weighs on both
            for way, workers in (("serial", 1), ("parallel", None)):
                start = time.perf_counter()
                reports[way] = analyze_paths([folder], workers=workers)
                elapsed = time.perf_counter() - start
                times[way] = min(times.get(way, elapsed), elapsed)
    same = verdicts(reports["serial"]) == verdicts(reports["parallel"])
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {args.ranks} ranks of {args.trace.name}")
    print(f"serial {times['serial']:.3f}s  parallel {times['parallel']:.3f}s  "
          f"ratio {times['parallel'] / times['serial']:.2f}  same verdicts: {same} "
          f"({len(verdicts(reports['serial']))} verdicts)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
