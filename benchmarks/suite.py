"""Every benchmark, side by side with the peers, in one command; results saved as JSON.

    python benchmarks/suite.py                 # about 17 min on 2 cores, idle (2026-11-28)
    python benchmarks/suite.py --quick         # about 4 min: smaller models, fewer steps and rounds
    python benchmarks/suite.py --only rss --only short_runs     # some sections

The sections, in the order they run (``--only NAME``; each module also runs alone, see its docstring):

- ``overhead``: Lightning, accelerate and HF Trainer, each variant against no profiling, in rotating rounds
  (``overhead.py``); ``alternating``: the telemetry inside one process, the engine's events sent on every other
  step; ``host_cost``: the engine's events alone, µs a step.
- ``publish``: the published state a step and a look of the live watch (``overhead.publish_cost``).
- ``short_runs``: what ``PerfCallback()`` adds to a 20-step BoringModel fit, close included, and the share of a
  fast run's steps that overlap perfhooks' own work (``overhead.close_cost``, ``overhead.overlap_share``).
- ``rss``: the peak RSS ``PerfCallback()`` adds to the demo Transformer's fit, each fit in a fresh process
  (``overhead.peak_rss_added``).
- ``annotation``: ns a call of NVTX, ``record_function`` and a phase change (``annotation_cost.py``).
- ``analysis``: analysis speed and memory on the repo's real traces and on synthetic ones of 1M and 3M events
  (``analysis_speed.py``, ``synthetic.py``), against ``json.loads``, HTA and the TensorBoard plugin. The peers
  come from ``--peers-python`` (an interpreter with benchmarks/requirements.txt) or this one if it has them.
- ``memory_capture``: a capture's pause on the training thread (``memory_capture.py``).
- ``top_frame``: one frame of ``perfhooks top`` over 1,000 ranks' live files (``top_frame.py``).
- ``short_jobs``: two short CPU jobs (a small GPT under accelerate with 8 micro-batches a step, and a plain loop),
  whole loops and peak RSS, plain against the defaults, in fresh processes (``short_jobs.py``).
- ``budget``, ``reader``, ``lightning_parts``: on the simulated GPU (``tests/simulated_gpu.py``, each device call
  charged its host cost on an H100), the cost budget's checks, the timing reader's Python a step, and a host-bound
  Lightning fit with each part of perfhooks off in turn (``sim_step_cost.py``).
- ``cuda`` (on a GPU only): CUDA-event timing against ``torch.cuda._sleep``, and the memory history's overhead.
  ``gpu_check.sh`` is the GPU's fuller check.

Every comparison runs its variants in rotating rounds (``common.rotate_rounds``). ``--rounds`` sets the
framework comparisons' rounds; the other sections take theirs from ``--quick``. Results go to
``benchmarks/results/<hostname>-<date>.json`` with the machine and versions; each target is printed as met or
missed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analysis_speed  # noqa: E402
import annotation_cost  # noqa: E402
import memory_capture  # noqa: E402
import overhead  # noqa: E402
import short_jobs  # noqa: E402
import sim_step_cost  # noqa: E402
import synthetic  # noqa: E402
import top_frame  # noqa: E402
from common import describe_machine, machine_info, on_the_simulated_gpu, rotate_rounds  # noqa: E402

TARGETS = {
    "telemetry_overhead": ("perfhooks (outside windows) / none", 1.01, "max"),
    "host_cost_us": ("engine host cost per step, µs", 20.0, "max"),
    "window_vs_bare": ("perfhooks window / bare torch.profiler", 1.05, "max"),
    "publish_us": ("a step's publication, µs", overhead.PUBLISH_TARGET_US, "max"),
    "look_share_of_core": ("a live watch look, share of a core", overhead.LOOK_TARGET_SHARE, "max"),
    "close_added_s": ("a 20-step fit's added time, window and close included, s", overhead.CLOSE_TARGET_S, "max"),
    "overlap_share": ("a fast run's steps overlapping perfhooks' work", overhead.OVERLAP_TARGET, "max"),
    "rss_added_mb": ("peak RSS added, defaults, MB", overhead.RSS_TARGET_MB, "max"),
    "analyze_vs_json_loads": ("analyze / json.loads", 1.5, "max"),
    "rss_over_json": ("peak RSS / JSON bytes", 3.0, "max"),
    "speedup_vs_peers": ("speed-up vs HTA and the TB plugin", 5.0, "min"),
    "scaling_3m_over_1m": ("time at 3M events / time at 1M", 3.3, "max"),
    "top_frame_s": ("perfhooks top frame, 1,000 ranks, s", top_frame.TARGET_S, "max"),
    "light_step_us": ("a light step in place, simulated GPU, µs", 8.0, "max"),
    "budget_ratio": ("the defaults / bare, simulated launch-bound loop", 1.02, "max"),
}


def check(name: str, value: float | None, verdicts: dict[str, Any], detail: str = "") -> None:
    label, limit, kind = TARGETS[name]
    met = None if value is None else (value <= limit if kind == "max" else value >= limit)
    verdicts.setdefault(name, []).append({"value": value, "limit": limit, "met": met, "detail": detail})
    sign = "<=" if kind == "max" else ">="
    state = "n/a" if met is None else ("met" if met else "MISSED")
    shown = "n/a" if value is None else f"{value:.4g}"
    print(f"  target {label} {sign} {limit}: {shown} {state} {detail}")


def peers_available(python: str | None) -> bool:
    if python:
        return True
    try:
        import hta  # noqa: F401
        import torch_tb_profiler  # noqa: F401
    except ImportError:
        return False
    return True


def analysis_section(quick: bool, peers_python: str | None, verdicts: dict[str, Any]) -> dict[str, Any]:
    peers = peers_available(peers_python)
    if not peers:
        print("  peers: not installed (pip install -r benchmarks/requirements.txt, or --peers-python); skipped")
    traces = sorted((HERE.parent / "tests" / "data" / "traces").rglob("*.json.gz"))
    base = analysis_speed.baseline_rss_bytes()
    rows = []
    print(analysis_speed.HEADER)
    for path in traces:
        row = analysis_speed.measure_trace(path, peers, peers_python, baseline_rss=base)
        rows.append(row)
        print(analysis_speed.format_row(row), flush=True)
    sizes = (200_000, 600_000) if quick else (1_000_000, 3_000_000)
    synthetic_rows = []
    with tempfile.TemporaryDirectory() as folder:
        for size in sizes:
            path = Path(folder) / f"synthetic_{size // 1000}k.json"
            synthetic.write_synthetic(size, path)
            row = analysis_speed.measure_trace(path, peers and size == sizes[0], peers_python, repeats=1,
                                               baseline_rss=base)
            synthetic_rows.append(row)
            print(analysis_speed.format_row(row), flush=True)
            path.unlink()
    for row in rows + synthetic_rows:
        large = row["events"] >= 50_000  # small traces are dominated by fixed costs (imports, process start)
        if large:
            check("analyze_vs_json_loads", row["ratio_to_json_loads"], verdicts, row["trace"])
            check("rss_over_json", row["rss_over_json"], verdicts, row["trace"])
            for peer in ("hta", "tb_plugin"):
                if f"speedup_vs_{peer}" in row:
                    check("speedup_vs_peers", row[f"speedup_vs_{peer}"], verdicts, f"{peer} on {row['trace']}")
    scaling = synthetic_rows[1]["analyze_s"] / synthetic_rows[0]["analyze_s"]
    check("scaling_3m_over_1m", scaling, verdicts, f"{sizes[1]} / {sizes[0]} events")
    return {"real": rows, "synthetic": synthetic_rows, "scaling": scaling}


def cuda_section(quick: bool) -> dict[str, Any]:
    """CUDA-event timing against a known device delay, and the memory-history overhead (CUDA only)."""
    import torch

    from perfhooks import Engine, PerfConfig

    cycles = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    truth = []
    for _ in range(10):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        truth.append(start.elapsed_time(end))
    with tempfile.TemporaryDirectory() as out:
        engine = Engine(PerfConfig(schedule=None, console=False, memory=False), out, "benchmark", device="cuda")
        for _ in range(20):
            engine.phase_start("forward")
            torch.cuda._sleep(cycles)
            engine.phase_start("optimizer")
            engine.step_end()
        report = engine.close()
    measured = report["phases"]["forward"]["p50_ms"]
    expected = statistics.median(truth)
    print(f"  CUDA timing: forward p50 {measured:.3f} ms vs _sleep {expected:.3f} ms "
          f"(error {abs(measured - expected) / expected:.2%})")
    steps = 10 if quick else 20
    history: dict[str, Any] = {}
    # memory_history from the start / armed on approach (a healthy run never arms) / off, interleaved rounds,
    # on the tutorial layer and a model 4x as wide
    for d_model in ((256,) if quick else (512, 2048)):
        def step_ms(mode: str, d_model: int = d_model) -> float:
            with tempfile.TemporaryDirectory() as out:
                return overhead.lightning_step_ms(f"perfhooks_history_{mode}", steps, d_model, out)

        times = rotate_rounds(("off", "from_start", "on_approach"), step_ms, 5)
        ratios = {mode: [a / b for a, b in zip(times[mode], times["off"], strict=True)]
                  for mode in ("from_start", "on_approach")}
        history[str(d_model)] = {mode: {"median": statistics.median(r), "min": min(r), "max": max(r)}
                                 for mode, r in ratios.items()}
        print(f"  memory history, d_model {d_model}, step time / off: from the start "
              f"{statistics.median(ratios['from_start']):.4f}, armed on approach "
              f"{statistics.median(ratios['on_approach']):.4f}")
    return {"timing_measured_ms": measured, "timing_expected_ms": expected,
            "timing_error": abs(measured - expected) / expected, "memory_history": history}


def overhead_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    print("overhead on the training loop")
    result = overhead.run(args.quick, args.rounds)
    for framework in ("lightning", "accelerate", "transformers"):
        for name, r in result[framework]["ratios"].items():
            print(f"  {framework:>12} {name:<40} median {r['median']:.4f} (min {r['min']:.4f}, max {r['max']:.4f})")
        check("telemetry_overhead", result[framework]["ratios"]["perfhooks"]["median"], verdicts, framework)
    check("window_vs_bare", result["lightning"]["ratios"]["perfhooks_window/bare_torch_profiler"]["median"],
          verdicts, "lightning")
    check("window_vs_bare", result["accelerate"]["ratios"]["perfhooks_window/ProfileKwargs"]["median"], verdicts,
          "accelerate (vs ProfileKwargs)")
    check("host_cost_us", result["host_cost_us"], verdicts)
    return result


def alternating_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    a = overhead.run_alternating(args.quick)
    print(f"  telemetry on/off, alternating steps in one process: median {a['median']:.4f} "
          f"(min {a['min']:.4f}, max {a['max']:.4f}) over {a['n']} pairs; pooled {a['pooled']:.4f}")
    check("telemetry_overhead", a["median"], verdicts, "alternating steps in one process")
    return a


def host_cost_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> float:
    cost = overhead.host_cost_us(steps=5_000 if args.quick else 20_000)
    print(f"  engine host cost per step: {cost:.2f} µs")
    check("host_cost_us", cost, verdicts)
    return cost


def publish_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    print("the published state and the live watch")
    result = overhead.publish_cost()
    check("publish_us", result["publish_us"], verdicts)
    check("look_share_of_core", result["look_share_of_core"], verdicts)
    return result


def short_runs_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    print("short runs: the close's cost, and the steps that overlap perfhooks' own work")
    close = overhead.close_cost(2 if args.quick else 5)
    check("close_added_s", close["added_s"], verdicts, "BoringModel, 20 steps")
    overlap = overhead.overlap_share()
    check("overlap_share", overlap["share"], verdicts, f"{overlap['steps']} steps of about 15 ms")
    return {"close": close, "overlap": overlap}


def rss_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    variants = args.rss_variant or (["default"] if args.quick else ["default", "no_window"])
    rounds = 1 if args.quick else 3
    print(f"peak RSS added to the demo Transformer's 40-step fit ({rounds} round(s), a fresh process a fit)")
    result = overhead.peak_rss_added(rounds, variants)
    if "default" in result["added_mib"]:
        check("rss_added_mb", result["added_mib"]["default"] * 2**20 / 1e6, verdicts, "defaults, a window included")
    return result


def annotation_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, float]:
    print("annotation cost (ns per call, no NVTX tool attached, no profiler recording)")
    result = annotation_cost.measure()
    for name, ns in result.items():
        published = annotation_cost.PUBLISHED.get(name)
        print(f"  {name:<26} {ns:8.0f} ns" + (f"   published: {published}" if published else ""))
    return result


def memory_capture_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    print("a memory capture's pause on the training thread (the tutorial layer with AdamW state)")
    return memory_capture.capture_pause(2 if args.quick else 5)


def top_frame_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    print("perfhooks top over 1,000 ranks")
    result = top_frame.frame_times(1000, 3 if args.quick else 5)
    check("top_frame_s", result["median_s"], verdicts)
    return result


def budget_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    rounds = 4 if args.quick else 12
    print(f"the cost budget on the simulated GPU ({rounds} rounds of 2000 steps)")
    with on_the_simulated_gpu() as gpu:
        result = sim_step_cost.budget(gpu, 2000, rounds)
    check("light_step_us", result["light_in_place_us"], verdicts, "perfhooks' own meter, median")
    check("budget_ratio", result["defaults_ratio"], verdicts, "mean step, median of paired rounds")
    return result


def short_jobs_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> list[dict[str, Any]]:
    pairs = 1 if args.quick else 3
    print(f"two short CPU jobs, plain against the defaults, whole loops in fresh processes ({pairs} pairs)")
    return [short_jobs.run(job, pairs) for job in ("accelerate", "plain")]


def reader_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    print("the timing reader's Python a step, on the simulated GPU")
    with on_the_simulated_gpu() as gpu:
        return sim_step_cost.reader_cost(gpu, 6 if args.quick else 15)


def lightning_parts_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    steps, rounds = (300, 2) if args.quick else (2000, 5)
    print(f"a host-bound Lightning fit on the simulated GPU, each part of perfhooks off in turn ({steps} steps, "
          f"{rounds} rounds)")
    with on_the_simulated_gpu() as gpu:
        return sim_step_cost.lightning_parts(gpu, steps, rounds)


def cuda_only_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any] | None:
    import torch

    if not torch.cuda.is_available():
        print("CUDA: no GPU here; skipped")
        return None
    print("CUDA")
    return cuda_section(args.quick)


def analysis_only_section(args: argparse.Namespace, verdicts: dict[str, Any]) -> dict[str, Any]:
    print("analysis speed and memory")
    return analysis_section(args.quick, args.peers_python, verdicts)


#: Each section: its name (``--only``) and what runs it, in the order they run.
SECTIONS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], Any]] = {
    "overhead": overhead_section,
    "alternating": alternating_section,
    "host_cost": host_cost_section,
    "publish": publish_section,
    "short_runs": short_runs_section,
    "rss": rss_section,
    "annotation": annotation_section,
    "analysis": analysis_only_section,
    "memory_capture": memory_capture_section,
    "top_frame": top_frame_section,
    "budget": budget_section,
    "short_jobs": short_jobs_section,
    "reader": reader_section,
    "lightning_parts": lightning_parts_section,
    "cuda": cuda_only_section,
}
#: Where each section's result goes in the results file (its name, unless said here).
RESULT_KEYS = {"host_cost": "host_cost_us", "annotation": "annotation_ns"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller models, fewer steps and rounds")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rotating rounds of the framework comparisons (at least 5)")
    parser.add_argument("--peers-python", default=os.environ.get("PERFHOOKS_PEERS_PYTHON"),
                        help="interpreter with HTA and torch-tb-profiler ($PERFHOOKS_PEERS_PYTHON, else this one)")
    parser.add_argument("--only", choices=list(SECTIONS), action="append",
                        help="run only these sections (repeatable)")
    parser.add_argument("--rss-variant", choices=sorted(overhead.RSS_VARIANTS), action="append",
                        help="the rss section's variants (repeatable; default: default and no_window, or default "
                             "with --quick)")
    parser.add_argument("--update", action="store_true", help="add the sections run to the existing results file")
    parser.add_argument("--output", type=Path, help="results file (default benchmarks/results/<host>-<date>.json)")
    args = parser.parse_args(argv)
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    chosen = args.only or list(SECTIONS)
    warnings.simplefilter("ignore")  # the frameworks' notices, from every fit of every round
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    info = machine_info()
    print(f"machine: {describe_machine()}")
    results: dict[str, Any] = {"machine": info, "date": datetime.date.today().isoformat(), "quick": args.quick,
                               "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])}
    verdicts: dict[str, Any] = {}
    running = [name for name in SECTIONS if name in chosen
               and not (name == "host_cost" and "overhead" in chosen)]  # the overhead section measures it too
    for number, name in enumerate(running, 1):
        print(f"{number}. ", end="")
        result = SECTIONS[name](args, verdicts)
        if result is not None:
            results[RESULT_KEYS.get(name, name)] = result
    file_name = f"{info['hostname']}-{results['date']}{'-quick' if args.quick else ''}.json"
    target = args.output or HERE / "results" / file_name
    if args.update and target.exists():  # add these sections to an earlier run's results
        earlier = json.loads(target.read_text())
        verdicts = {**earlier.get("targets", {}), **verdicts}
        results = {**earlier, **{k: v for k, v in results.items() if k not in ("command", "date")},
                   "command": f"{earlier.get('command')}; {results['command']}"}
    results["targets"] = verdicts
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"results: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
