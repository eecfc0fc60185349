"""Speed and memory of ``perfhooks analyze`` on real traces, next to the standard library and the peers.

    python benchmarks/analysis_speed.py [TRACE ...]     # default: the traces in tests/data/traces

Per trace it prints:
- the time of ``perfhooks analyze`` (read, gunzip, parse, every analyzer, diagnoses) ÷ the time of
  ``json.loads`` on the same uncompressed text (best of 3 each; target at most 1.5);
- peak RSS of a fresh process analysing it, ÷ the uncompressed JSON size (target at most 3);
- where installed (benchmarks/requirements.txt), HTA's ``TraceAnalysis`` load plus
  ``get_temporal_breakdown`` and the TensorBoard plugin's ``RunProfileData.parse``, as speed-ups.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# VmHWM (the peak RSS of this address space) is reset by exec; ru_maxrss is not: it would carry the
# parent's peak into the child.
PEAK_RSS = """
import sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
from perfhooks.analysis.analyze import analyze_paths
if len(sys.argv) > 1:
    analyze_paths([sys.argv[1]])
print(peak())
"""


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def peak_rss_bytes(path: Path) -> int:
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])


def baseline_rss_bytes() -> int:
    """Peak RSS of an interpreter that imported perfhooks' analysis and analysed nothing."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])


def hta_seconds(path: Path) -> float | None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as folder:
        os.symlink(path.resolve(), Path(folder) / "rank0.json.gz")
        start = time.perf_counter()
        TraceAnalysis(trace_dir=folder).get_temporal_breakdown(visualize=False)
        return time.perf_counter() - start


def tb_plugin_seconds(path: Path) -> float | None:
    try:
        from torch_tb_profiler.profiler.data import RunProfileData
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        RunProfileData.parse("worker", "span", str(path), cache)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--peers", action="store_true", help="also time HTA and the TensorBoard plugin")
    args = parser.parse_args(argv)
    from perfhooks.analysis.analyze import analyze_paths
    from perfhooks.device import _cpu_model

    traces = args.traces or sorted((REPO / "tests" / "data" / "traces").rglob("*.json.gz"))
    print(f"machine: {_cpu_model()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    base = baseline_rss_bytes()
    print(f"{'trace':<58} {'events':>7} {'MB':>6} {'json.loads':>10} {'analyze':>8} {'ratio':>6} {'RSS/JSON':>8}"
          + ("  HTA x   TB x" if args.peers else ""))
    for path in traces:
        text = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        events = len(json.loads(text).get("traceEvents", []))
        loads = best_of(lambda text=text: json.loads(text))
        analyze = best_of(lambda path=path: analyze_paths([path]))
        memory = (peak_rss_bytes(path) - base) / len(text)
        line = (f"{path.name[:58]:<58} {events:>7} {len(text) / 1e6:>6.1f} {loads:>9.3f}s {analyze:>7.3f}s "
                f"{analyze / loads:>6.2f} {memory:>8.2f}")
        if args.peers:
            hta, tb = hta_seconds(path), tb_plugin_seconds(path)
            speedups = ["  n/a" if seconds is None else f"{seconds / analyze:5.1f}" for seconds in (hta, tb)]
            line += "  " + "  ".join(speedups)
        print(line)
    print("targets: ratio <= 1.5 (analyze time / json.loads time), RSS/JSON <= 3 (peak RSS above an idle "
          "interpreter with perfhooks imported, / uncompressed JSON bytes); peers: >= 5x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
