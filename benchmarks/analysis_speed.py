"""Speed and memory of ``perfhooks analyze`` on real traces, next to the standard library and the peers.

    python benchmarks/analysis_speed.py [TRACE ...]     # default: the traces in tests/data/traces

Per trace it prints:
- the time of ``perfhooks analyze`` (read, gunzip, parse, every analyzer, diagnoses) ÷ the time of
  ``json.loads`` on the same uncompressed text (best of 3 each; target at most 1.5);
- peak RSS of a fresh process analysing it, ÷ the uncompressed JSON size (target at most 2.0 from 50,000 events);
- where installed (benchmarks/requirements.txt), HTA's ``TraceAnalysis`` load plus
  ``get_temporal_breakdown`` and the TensorBoard plugin's ``RunProfileData.parse``, as speed-ups (target 8x).
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# VmHWM (the peak RSS of this address space) is reset by exec; ru_maxrss is not: it would carry the
# parent's peak into the child.
PEAK_RSS = """
import sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
from perfhooks.offline.analyze import analyze_paths
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
        os.symlink(path.resolve(), Path(folder) / ("rank0.json.gz" if path.name.endswith(".gz") else "rank0.json"))
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


def peer_seconds(peer: str, path: Path, python: str | None) -> float | None:
    """Seconds the peer takes on ``path``; run by ``python`` (the benchmark environment with the peers)."""
    if python is None:
        return (hta_seconds if peer == "hta" else tb_plugin_seconds)(path)
    done = subprocess.run([python, __file__, "--peer", peer, str(path)], capture_output=True, text=True,
                          timeout=3600, check=False)
    lines = done.stdout.strip().splitlines()
    return float(lines[-1]) if done.returncode == 0 and lines and lines[-1] != "None" else None


def _json_loads_figures(path: Path, repeats: int) -> tuple[int, int, float]:
    """Events, uncompressed bytes, and the best ``json.loads`` time (s) of the uncompressed text."""
    text = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    document = json.loads(text)
    events = len(document if isinstance(document, list) else document.get("traceEvents", []))  # 2021: an array
    del document
    return events, len(text), best_of(lambda: json.loads(text), repeats)


def measure_trace(path: Path, peers: bool = False, peers_python: str | None = None, repeats: int = 3,
                  baseline_rss: int | None = None) -> dict[str, Any]:
    """One trace's figures: events, bytes, json.loads and analyze seconds (best of ``repeats``), RSS/JSON,
    and with ``peers`` HTA's and the TensorBoard plugin's seconds."""
    from perfhooks.offline.analyze import analyze_paths

    events, json_bytes, loads = _json_loads_figures(path, repeats)  # the text is freed before analyze runs
    analyze = best_of(lambda: analyze_paths([path]), repeats)
    base = baseline_rss if baseline_rss is not None else baseline_rss_bytes()
    result: dict[str, Any] = {"trace": path.name, "events": events, "json_bytes": json_bytes,
                              "json_loads_s": loads, "analyze_s": analyze, "ratio_to_json_loads": analyze / loads,
                              "rss_over_json": (peak_rss_bytes(path) - base) / json_bytes}
    if peers:
        for peer in ("hta", "tb_plugin"):
            seconds = peer_seconds(peer, path, peers_python)
            result[f"{peer}_s"] = seconds
            result[f"speedup_vs_{peer}"] = seconds / analyze if seconds else None
    return result


def format_row(r: dict[str, Any]) -> str:
    line = (f"{r['trace'][:58]:<58} {r['events']:>8} {r['json_bytes'] / 1e6:>7.1f} {r['json_loads_s']:>9.3f}s "
            f"{r['analyze_s']:>7.3f}s {r['ratio_to_json_loads']:>6.2f} {r['rss_over_json']:>8.2f}")
    for peer in ("hta", "tb_plugin"):
        if f"speedup_vs_{peer}" in r:
            speedup = r[f"speedup_vs_{peer}"]
            line += f"  {speedup:5.1f}" if speedup else "    n/a"
    return line


HEADER = (f"{'trace':<58} {'events':>8} {'MB':>7} {'json.loads':>10} {'analyze':>8} {'ratio':>6} {'RSS/JSON':>8}"
          "  HTA x  TB x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--peers", action="store_true", help="also time HTA and the TensorBoard plugin")
    parser.add_argument("--peers-python", help="an interpreter with the peers installed (default: this one)")
    parser.add_argument("--peer", choices=("hta", "tb_plugin"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer:
        print((hta_seconds if args.peer == "hta" else tb_plugin_seconds)(args.traces[0]))
        return 0
    from perfhooks.device.describe import cpu_model

    traces = args.traces or sorted((REPO / "tests" / "data" / "traces").rglob("*.json.gz"))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(HEADER)
    base = baseline_rss_bytes()
    for path in traces:
        print(format_row(measure_trace(path, args.peers, args.peers_python, baseline_rss=base)), flush=True)
    print("targets: ratio <= 1.5 (analyze time / json.loads time), RSS/JSON <= 2.0 from 50k events (peak RSS above "
          "an idle interpreter with perfhooks imported, / uncompressed JSON bytes); peers: >= 8x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
