"""``perfhooks top`` on a 1,000-rank job: one frame read from 1,000 synthetic live files and rendered.

    python benchmarks/top_frame.py [--ranks 1000]

Target: under 1 s a frame (read, sort, summarise, render with rich to a string), on this project's 2-core
machine. Each figure is the median of 5 frames.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import describe_machine

TARGET_S = 1.0


def write_live_files(folder: Path, ranks: int) -> None:
    now = time.time()
    for rank in range(ranks):
        node = folder / f"node{rank // 8}"
        node.mkdir(exist_ok=True)
        stalled = rank == 17
        live = {"rank": rank, "world_size": ranks, "host": f"node{rank // 8}", "pid": 1000 + rank,
                "updated_at": now, "status": "running", "step": 1200, "global_step": 1200, "steps_per_s": 2.5,
                "step_p50_ms": 400.0 + rank % 13, "step_p95_ms": 430.0, "phase": "data_wait" if stalled else
                "backward", "in_phase_s": 130.0 if stalled else 0.2, "stalled": stalled,
                "shares": {"data_wait": 0.02, "forward": 0.3, "backward": 0.6, "optimizer": 0.05, "other": 0.03},
                "stack": ["/job/train.py:88 in main", "/job/data.py:42 in __getitem__"] if stalled else [],
                "memory_bytes": 60 * 2**30, "samples_per_s": 80.0, "tokens_per_s": 160000.0,
                "verdicts": ["communication_heavy"], "stalls": []}
        (node / f"live.rank{rank}.json").write_text(json.dumps(live))


def frame_s(folders: list[str]) -> float:
    from rich.console import Console

    from perfhooks.cli.top import read_frame, render

    started = time.perf_counter()
    frame = read_frame(folders)
    Console(file=io.StringIO(), width=200).print(render(frame))
    return time.perf_counter() - started


def frame_times(ranks: int = 1000, frames: int = 5) -> dict[str, float]:
    """Seconds a ``perfhooks top`` frame of ``ranks`` live files takes: median, min and max of ``frames``."""
    with tempfile.TemporaryDirectory() as out:
        write_live_files(Path(out), ranks)
        folders = sorted(str(p) for p in Path(out).iterdir())
        times = [frame_s(folders) for _ in range(frames)]
    median = statistics.median(times)
    print(f"  perfhooks top, {ranks} ranks in {len(folders)} node folders: {median:.3f} s a frame (median of "
          f"{frames}; min {min(times):.3f}, max {max(times):.3f})")
    return {"ranks": ranks, "median_s": median, "min_s": min(times), "max_s": max(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1000)
    args = parser.parse_args()
    if args.ranks < 1:
        parser.error("--ranks must be at least 1")
    print(f"machine: {describe_machine()}")
    median = frame_times(args.ranks)["median_s"]
    print(f"target {TARGET_S:.1f} s: {'met' if median < TARGET_S else 'MISSED'} ({median / TARGET_S:.2f} of it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
