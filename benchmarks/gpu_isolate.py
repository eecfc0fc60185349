"""perfhooks' cost on a GPU with each run in a fresh process: what a window leaves behind, and perfhooks' own.

    python benchmarks/gpu_isolate.py --out DIR [--rounds 5] [--budget-s 300] [--dry-run] [--loops ...]

A ``torch.profiler`` window with CUDA activity attaches CUPTI to the process, and Kineto leaves it attached after
the window unless ``TEARDOWN_CUPTI=1`` (perfhooks sets it for its windows: ``detach_cupti``). An attached CUPTI
slows every later kernel launch of the process, so variants that share one process (``gpu_check.py``) are
comparable only while no window leaves it attached. Here each run is a child process of its own, and each figure
is what a user's run of that kind pays:

- ``bare``; ``bare_window`` (with ``--window-alone`` only): the same loop with a plain ``torch.profiler`` window
  over steps 10-12, no perfhooks (what any profiler window leaves behind);
- ``no_window``: perfhooks without windows (its own per-step cost);
- ``floor`` (the launch-bound loop): no perfhooks, the least any design does at the six step boundaries
  (``sim_step_cost.Floor``: take the time, record a pooled event, append; one capture check a step), so that
  ``no_window`` less ``floor`` is what perfhooks costs beyond it, and ``floor`` says whether +50 µs is reachable
  on that card at all;
- ``defaults``: perfhooks as it comes (its window lets CUPTI go); ``defaults_attached`` (with ``--attached``
  only): the same with ``detach_cupti=False`` (CUPTI left attached after the window, as before 2026-11-27; an H100
  and an H200 showed it, +480 µs a launch-bound step on the H200).

On the H200 (2026-11-28) one round in fresh processes read perfhooks without windows at +24 µs a launch-bound
step, where 18 alternating rounds in one process read +252: the fresh-process rounds come first now, and the
budget gives them the most.

Each child reports, per timed step (after the default window: steps 80-399 of 400, or 20-59 of 60 for the GPT),
the wall clock, the training thread's CPU time, the CPU time of every other thread and of each named Python
thread among them (perfhooks' are ``perfhooks-*``) (ms); the launch-bound
loop runs 3 times in its child (a later run of a window variant starts with CUPTI as the first left it), and the
child reports their medians. Rounds rotate the
variants' order and stop early, never below one, when ``--budget-s`` would be overrun; the JSON is saved after
each round. ``--dry-run`` (no GPU, or asked for) runs tiny on the CPU to show the script works.

First figures, an H100 80GB HBM3 (torch 2.11, CUDA 13.0), 2026-11-27, before ``detach_cupti`` (the window's
teardown then set by hand, ``TEARDOWN_CUPTI=1`` for the child): the 135M GPT, 2 rounds, medians 34.3 ms bare,
41.8 ms after a bare window, 35.8 ms without windows, 48.4 ms with the defaults and 35.9 ms with the defaults and
the teardown. ``benchmarks/results/gpu-2026-11-27-h100/gpu_isolate.json`` has every run. With perfhooks setting
the teardown itself (``third-call/`` and ``fourth-call/`` there, one round each): bare 42.6 and 29.6 ms, the
defaults 38.2 and 33.3 ms, the defaults with CUPTI left attached 48.2 and 46.0 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

#: Each variant: perfhooks' settings (None: not used) and whether a plain profiler window runs (no perfhooks).
Variant = tuple[dict[str, Any] | None, bool]
VARIANTS: dict[str, dict[str, Variant]] = {
    "launch_bound": {"bare": (None, False), "no_window": ({"schedule": None}, False),
                     "floor": ({"floor": True}, False), "defaults": ({}, False)},  # gpu_check.FLOOR
    #: a child here takes about 24 s on an H100 machine
    "lightning_gpt": {"bare": (None, False), "no_window": ({"schedule": None}, False), "defaults": ({}, False)},
}
#: Not run by default (known since 2026-11-27: any window leaves CUPTI attached): ``--window-alone``.
BARE_WINDOW: Variant = (None, True)
#: Not run by default (known since 2026-11-27, and ``detach_cupti`` is on by default): ``--attached``.
ATTACHED: Variant = ({"detach_cupti": False}, False)


#: Runs of the launch-bound loop in each child (a child starts in about 12 s on an H100 machine; a run takes 1 s).
LAUNCH_BOUND_RUNS = 3


def child(loop: str, name: str, dry: bool) -> dict[str, Any]:
    """Run ``loop`` under variant ``name`` in this process; its per-step figures (the median of its runs)."""
    import gpu_check
    import torch

    extra = {"bare_window": BARE_WINDOW, "defaults_attached": ATTACHED}
    settings, raw_window = extra[name] if name in extra else VARIANTS[loop][name]
    device = "cpu" if dry or not torch.cuda.is_available() else "cuda"
    spans: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as out:
        if loop == "launch_bound":
            job = gpu_check.launch_bound_job(device, dry)
            gpu_check.launch_bound_ms(job, None, 20, device, out)  # warm-up, bare: no window, no CUPTI
            for _ in range(LAUNCH_BOUND_RUNS):
                span = gpu_check.Span()
                gpu_check.launch_bound_ms(job, settings, 60 if dry else 400, device, out, raw_window, span)
                spans.append(span.per_step())
        else:
            span = gpu_check.Span()
            gpu_check.lightning_gpt_ms(settings, gpu_check.FIRST_TIMED_STEP + (4 if dry else 40), device, dry, out,
                                       raw_window, span)
            spans.append(span.per_step())
    figures: dict[str, Any] = medians(spans)
    names = {name for run in spans for name in run["threads_cpu_ms"]}
    figures["threads_cpu_ms"] = {name: round(statistics.median(run["threads_cpu_ms"].get(name, 0.0) for run in spans),
                                             4) for name in sorted(names)}
    return figures


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median over ``runs`` of the step time and the two CPU times (ms)."""
    return {key: round(statistics.median(run[key] for run in runs), 4)
            for key in ("step_ms", "main_cpu_ms", "other_cpu_ms")}


def run_child(loop: str, name: str, dry: bool) -> dict[str, Any]:
    """``child`` in a fresh interpreter."""
    command = [sys.executable, __file__, "--child", loop, name] + (["--dry-run"] if dry else [])
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"}
    return {**json.loads(lines[-1]), "process_s": round(time.monotonic() - started, 1)}


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians of each variant's runs, and each median's step time against bare's (µs added)."""
    median: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        good = [result for result in results if "error" not in result]
        if good:
            median[name] = medians(good)
    bare = median.get("bare", {}).get("step_ms")
    added = {name: round((m["step_ms"] - bare) * 1e3, 1) for name, m in median.items()} if bare else {}
    return {"rounds": len(runs.get("bare", [])), "runs": runs, "median": median, "added_us_per_step": added}


def alternate(loop: str, rounds: int, deadline: float, dry: bool, save: Any, window_alone: bool = False,
              attached: bool = False) -> dict[str, Any]:
    """Every variant of ``loop``, each in a child process, round after round (``gpu_check.rotate_rounds``)."""
    import gpu_check

    names = list(VARIANTS[loop]) + (["bare_window"] if window_alone else []) + (
        ["defaults_attached"] if attached else [])
    runs = gpu_check.rotate_rounds(names, lambda name: run_child(loop, name, dry), rounds, deadline,
                                   after_round=lambda so_far: save(loop, summary(so_far)))
    return summary(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder for gpu_isolate.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=300.0, help="seconds for the whole script (default 300)")
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU, one round")
    parser.add_argument("--loops", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--window-alone", action="store_true",
                        help="also a plain torch.profiler window without perfhooks (bare_window)")
    parser.add_argument("--attached", action="store_true",
                        help="also perfhooks' defaults with CUPTI left attached after the window (defaults_attached)")
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.dry_run)))
        return
    if not args.out:
        parser.error("--out is required: the folder for gpu_isolate.json")
    import torch
    from machine import describe_machine

    dry = args.dry_run or not torch.cuda.is_available()
    result: dict[str, Any] = {"machine": describe_machine(), "dry_run": dry, "torch": torch.__version__,
                              "card": None if dry else torch.cuda.get_device_name(0)}
    saved = Path(args.out) / "gpu_isolate.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def save(loop: str, so_far: dict[str, Any]) -> None:
        result[loop] = so_far
        result["seconds"] = round(time.monotonic() - started, 1)
        saved.write_text(json.dumps(result, indent=1))

    shares = {"launch_bound": 0.5, "lightning_gpt": 1.0}  # two rounds of four on an H200 machine, then the GPT
    for loop in args.loops:
        deadline = started + shares[loop] * args.budget_s if len(args.loops) > 1 else started + args.budget_s
        save(loop, alternate(loop, 1 if dry else args.rounds, deadline, dry, save, args.window_alone,
                             args.attached))
        print(f"{loop}: µs added a step {result[loop]['added_us_per_step']}")
        for name, median in result[loop]["median"].items():
            print(f"  {name:22s} {median}")
    print(f"{'DRY RUN: figures mean nothing; ' if dry else ''}{saved}, {result['seconds']} s")


if __name__ == "__main__":
    main()
