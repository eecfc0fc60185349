"""``benchmarks/gpu_check.py`` (and its ``--isolate`` mode) works without a GPU: a dry run on the CPU writes its one
JSON file and says so; ``sim_step_cost.py --bookkeeping`` still finds what it knocks out."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_dry_run_writes_every_part(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path),
                           "--dry-run"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["dry_run"] is True and result["why_dry"] in ("no CUDA device", "--dry-run")
    parts = {"bare", "no_window", "no_nvtx", "no_memory", "no_flop_count", "no_device_events", "torch_timer"}
    reading = {"reader_holds_gil", "reads_inline", "records_only", "floor"}
    for part, variants in (("launch_bound", parts | reading), ("lightning_gpt", parts)):
        assert set(result[part]["ratio"]) == variants
        assert result[part]["rounds"] == 1
        assert set(result[part]["cpu_ms"]) == set(result[part]["ratio"])
        assert all(cpu["main"] > 0 and cpu["other"] >= 0 and cpu["gc"] >= 0 and isinstance(cpu["threads"], dict)
                   for cpu in result[part]["cpu_ms"].values())
    for part in ("launch_bound", "lightning_gpt"):  # each profiled run's own account of its cost (issue 65)
        [account] = result[part]["overhead"]["no_window"]
        assert account["kept"] in (True, False) and 0 <= account["share_of_run"] < 1
    for name in ("bare", "no_window"):
        functions = [row["function"] for row in result["where_time_goes"][name]]
        assert len(functions) == 30 and all(row["calls"] > 0 for row in result["where_time_goes"][name])
    in_place = result["in_place"]  # the time inside perfhooks' entry points and the floor's, a step
    assert in_place["rounds"] == 1 and set(in_place["median_us"]) == {"no_window", "floor"}
    assert all(len(values) == 1 and values[0] > 0 for values in in_place["us_per_step"].values())
    assert all(0 < share < 1 for share in in_place["share_of_step"].values())
    gpt = result["in_place_gpt"]  # inside PerfCallback's step hooks and the tracker's fetch
    assert gpt["rounds"] == 1 and gpt["median_us"]["no_window"] > 0 and 0 < gpt["share_of_step"]["no_window"] < 1
    assert "DRY RUN" in done.stdout


def test_the_simulated_run_measures_every_variant_with_the_device_calls_charged(tmp_path: Path) -> None:
    """``--simulated``: the launch-bound loop's variants with perfhooks on the simulated GPU, each with its paired
    difference from bare and its threads' CPU and garbage collection; the timing reader's thread runs where the
    steps are read on it, and not where nothing reads them or the training thread does."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path),
                           "--simulated", "--rounds", "1", "--steps", "100"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((tmp_path / "gpu_check_simulated.json").read_text())
    result = written["launch_bound"]
    variants = set(_gpu_check().PARTS) - {"bare"}
    assert result["rounds"] == 1 and set(result["paired_added_us"]) == set(result["paired_cpu_added_us"]) == variants
    threads = {name: cpu["threads"] for name, cpu in result["cpu_ms"].items()}
    assert "perfhooks-timings" in threads["no_window"] and "perfhooks-timings" in threads["reader_holds_gil"]
    for name in ("bare", "reads_inline", "records_only", "no_device_events", "floor"):
        assert "perfhooks-timings" not in threads[name], name
    assert all(cpu["gc"] >= 0 for cpu in result["cpu_ms"].values())
    assert written["in_place"]["rounds"] == 1 and set(written["in_place"]["median_us"]) == {"no_window", "floor"}


def _gpu_check() -> Any:
    """The benchmark module, imported with ``sys.path`` put back as it was (it adds ``benchmarks/`` itself)."""
    path = list(sys.path)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path[:] = path
    return gpu_check


def test_rounds_stop_before_the_one_that_would_overrun_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run takes 1 s of a manual clock, 11 runs a round (every part): with 28 s of budget, the second round
    (ending at 22 s) runs and the third (33 s) is not begun. The first round always runs."""
    gpu_check = _gpu_check()
    assert len(gpu_check.PARTS) == 11
    now = [0.0]

    def measure(settings: Any) -> float:
        now[0] += 1.0
        return 2.0 if settings is None else 2.5

    result = gpu_check.alternate(measure, rounds=5, deadline=28.0, clock=lambda: now[0])
    assert result["rounds"] == 2 and now[0] == 22.0
    assert result["ratio"]["no_nvtx"] == 1.25 and result["added_us_per_step"]["no_window"] == 500.0
    assert result["paired_added_us"]["reads_inline"] == {"median_us": 500.0, "slower_rounds": "2/2"}
    assert gpu_check.alternate(measure, rounds=5, deadline=-1.0, clock=lambda: now[0])["rounds"] == 1
    gpt = gpu_check.alternate(measure, rounds=1, deadline=0.0, names=["bare", "no_window"])
    assert set(gpt["ratio"]) == {"bare", "no_window"}


def test_paired_differences_cancel_the_drift_between_rounds() -> None:
    """The machine slows down round after round: each variant's own median carries the drift, the same-round
    differences do not (+100 µs in two rounds of three, -100 in the third)."""
    gpu_check = _gpu_check()
    paired = gpu_check.paired_added_us({"bare": [1.0, 3.0, 5.0], "no_window": [1.1, 3.1, 4.9]})
    assert paired == {"no_window": {"median_us": 100.0, "slower_rounds": "2/3"}}


def test_the_training_threads_cpu_is_paired_like_the_step() -> None:
    """Runs that report their threads' CPU: the training thread's CPU a step of each variant less bare's in the same
    round, beside the wall clock's pairing (here the step drifts by 1 ms a round and the CPU does not)."""
    gpu_check = _gpu_check()
    rounds = iter(range(100))

    def measure(settings: Any) -> dict[str, Any]:
        drift = next(rounds) // len(gpu_check.PARTS)
        added = 0.0 if settings is None else 0.05
        return {"step_ms": 1.0 + drift + 2 * added, "main_cpu_ms": 0.8 + added, "other_cpu_ms": 0.1}

    result = gpu_check.alternate(measure, rounds=3, deadline=float("inf"))
    assert result["paired_added_us"]["no_window"] == {"median_us": 100.0, "slower_rounds": "3/3"}
    assert result["paired_cpu_added_us"]["no_window"] == {"median_us": 50.0, "slower_rounds": "3/3"}
    assert result["cpu_ms"]["bare"]["main"] == 0.8


@pytest.mark.slow
def test_the_isolated_dry_run_runs_each_variant_in_a_process_of_its_own(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--isolate", "--out",
                           str(tmp_path), "--dry-run", "--loops", "launch_bound", "--window-alone", "--attached"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_isolate.json").read_text())
    assert result["dry_run"] is True and result["launch_bound"]["rounds"] == 1
    runs = result["launch_bound"]["runs"]
    assert set(runs) == {"bare", "bare_window", "no_window", "floor", "defaults", "defaults_attached"}
    for name, (run,) in runs.items():
        assert "error" not in run, f"{name}: {run}"
        assert run["step_ms"] > 0 and run["main_cpu_ms"] > 0 and run["other_cpu_ms"] >= 0
    assert result["launch_bound"]["added_us_per_step"]["bare"] == 0.0
    assert "DRY RUN" in done.stdout


@pytest.mark.slow
def test_sim_step_costs_bookkeeping_run_knocks_out_each_piece() -> None:
    """``sim_step_cost.py --bookkeeping`` still reaches the pieces it knocks out (perfhooks' own methods, by name):
    a run of one round names the whole and each piece with a figure."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sim_step_cost.py"), "--bookkeeping",
                           "--rounds", "1", "--steps", "50"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "perfhooks' own Python" in done.stdout
    for piece in ("the statistics", "a step's end for the other threads", "the published state alone",
                  "the step's open"):
        assert piece in done.stdout and "µs, paired" in done.stdout.split(piece)[1].split("\n")[0], piece
