"""``perfhooks tune SCRIPT [ARGS...]``: try the fixes perfhooks' diagnoses name on the user's own script, one trial
each, and report what each really gains.

Each trial is the unmodified script under the launcher (``perfhooks run``) in a process of its own, in trial mode
(:mod:`perfhooks.integrations.trials`): its framework writes into the trial's temporary folder, W&B is disabled, a
knob is set at the framework's seam, and training stops after the warm-up and ``--steps`` steady steps. The
baseline trial runs first; its facts and diagnoses choose the candidates (:func:`perfhooks.offline.tune.plan`).
It runs again after the last trial, so that a machine that changed meanwhile widens every interval (and flags
the trials, :func:`perfhooks.offline.tune.flags`).
A trial that fails or passes ``--max-trial-s`` is reported and the others go on; Ctrl-C stops with the trials
done so far. ``tune.json`` and each trial's report land in ``--output-dir`` (default ``perfhooks_tune``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perfhooks.cli.machine import out
from perfhooks.files.atomic import read_json_object
from perfhooks.offline.gate import WARMUP_STEPS, bootstrap_interval, steady_steps_ms
from perfhooks.offline.tune import (
    KNOB_NAMES,
    ceilings,
    flags,
    format_table,
    mark_losses,
    measure,
    measured_losses,
    oversubscribed,
    plan,
    ranked,
    untried,
)

#: The variables a trial's process gets on top of the user's environment.
TRIAL_ENVIRONMENT = {"PERFHOOKS_CONSOLE": "0", "PERFHOOKS_WANDB": "0",
                     "PERFHOOKS_REPORT_EVERY_S": "0", "PERFHOOKS_CONSOLE_EVERY_S": "0", "WANDB_MODE": "disabled",
                     "PYTHONHASHSEED": "0"}


#: A trial's capture window, after its measured steps (its steps are perfhooks' own, out of the figures): one step
#: of the profiler's warm-up and two recorded, whose top operators tell an operator that got slower in a trial
#: whose step got faster (:func:`perfhooks.offline.tune.flags`).
WINDOW_WARMUP, WINDOW_ACTIVE = 1, 2


def trial_schedule(measured_steps: int) -> str:
    """``PERFHOOKS_SCHEDULE`` for a trial of ``measured_steps`` (its warm-up and steady steps): a window after them."""
    return f"skip_first={measured_steps},wait=0,warmup={WINDOW_WARMUP},active={WINDOW_ACTIVE},repeat=1"


class Tuner:
    """Runs the trials of one ``perfhooks tune`` call."""

    def __init__(self, target: str, arguments: list[str], settings_env: dict[str, str], steps: int,
                 max_trial_s: float, work: Path, kept: Path | None = None) -> None:
        self.target, self.arguments = target, arguments
        self.settings_env = settings_env
        self.steps, self.max_trial_s = steps, max_trial_s
        self.work = work
        #: Where each trial's logs are kept once the tune ends (``<output_dir>/trials``; the work folder goes).
        self.kept = kept

    def trial(self, name: str, knobs: dict[str, Any]) -> dict[str, Any]:
        """One trial: ``{name, status, report, losses, facts, stopped, wall_s, error}``; ``status`` is
        ``measured``, ``failed`` or ``timed out``. Ctrl-C stops the trial's process and propagates."""
        folder = self.work / name
        folder.mkdir(parents=True)
        plan_path, result_path = folder / "plan.json", folder / "trial.json"
        measured = WARMUP_STEPS + self.steps
        plan_path.write_text(json.dumps({"name": name, "knobs": knobs,
                                         "stop_after": measured + WINDOW_WARMUP + WINDOW_ACTIVE,
                                         "folder": str(folder / "framework"), "result": str(result_path)}))
        env = {**os.environ, **self.settings_env, **TRIAL_ENVIRONMENT, "PERFHOOKS_TUNE_TRIAL": str(plan_path),
               "PERFHOOKS_OUTPUT_DIR": str(folder / "perfhooks"), "PERFHOOKS_SCHEDULE": trial_schedule(measured)}
        command = [sys.executable, "-m", "perfhooks", "run", self.target, *self.arguments]
        started = time.monotonic()
        with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            try:
                code = process.wait(timeout=self.max_trial_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code = None
            except KeyboardInterrupt:
                process.kill()
                process.wait()
                raise
        outcome: dict[str, Any] = {"name": name, "knobs": knobs, "wall_s": round(time.monotonic() - started, 2)}
        log = (self.kept / name / "stderr.txt") if self.kept is not None else folder / "stderr.txt"
        return {**outcome, **_read_outcome(folder, code, self.max_trial_s, log)}


#: Lines of a failed trial's log quoted in its error (the traceback's end).
QUOTED_LINES = 8


def _read_outcome(folder: Path, code: int | None, max_trial_s: float, log: Path) -> dict[str, Any]:
    report_path = folder / "perfhooks" / "report.json"
    result = read_json_object(folder / "trial.json") or {}
    report = read_json_object(report_path)
    outcome = {"losses": result.get("losses") or {}, "facts": result.get("facts") or {},
               "stopped": result.get("stopped"), "report": report, "log": str(log)}
    if code is None:
        return {**outcome, "status": "timed out", "error": f"still running after --max-trial-s {max_trial_s:g} s"}
    if code != 0 or report is None:
        lines = [line for line in (folder / "stderr.txt").read_text(errors="replace").splitlines() if line.strip()]
        why = "no report was written" if code == 0 else f"exit {code}"
        quoted = "\n".join(f"    {line[:300]}" for line in lines[-QUOTED_LINES:]) or "    (the log is empty)"
        return {**outcome, "status": "failed", "error": f"{why}; the log ends:\n{quoted}"}
    return {**outcome, "status": "measured"}


def run_tune(target: str, arguments: list[str], settings_env: dict[str, str], steps: int, only: tuple[str, ...],
             output: str, max_trial_s: float, output_dir: str, job_steps: int | None = None) -> int:
    """The whole ``perfhooks tune``: baseline, plan, trials, table or JSON. 0 when the baseline was measured,
    1 when it failed, 130 after Ctrl-C (with the trials done so far). ``job_steps``: the job's length (optimizer
    steps) a one-time cost is held against; None: the framework's ``max_steps`` if the script set one, else each
    trial's own length."""
    work = Path(tempfile.mkdtemp(prefix="perfhooks-tune-"))
    tuner = Tuner(target, arguments, settings_env, steps, max_trial_s, work, kept=Path(output_dir) / "trials")
    result: dict[str, Any] = {"script": target, "arguments": arguments, "steps": steps, "trials": [], "skipped": []}
    status = 0
    running = "baseline"
    try:
        _say(f"a baseline trial of {WARMUP_STEPS} warm-up and {steps} steady steps (at most {max_trial_s:g} s), then "
             "one trial per change that applies")
        base = tuner.trial("baseline", {})
        if base["status"] != "measured":
            _say(f"the baseline trial {base['status']}: {base.get('error')}\n(the whole log: {base['log']})")
            return 1
        result["baseline"] = _baseline_entry(base)
        job = job_steps or _positive(base["facts"].get("job_steps"))
        result["job_steps"] = job
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        device = ((base["report"] or {}).get("device") or {}).get("type")
        diagnoses = [d["id"] for d in (base["report"] or {}).get("diagnoses") or []]
        trials, result["skipped"] = plan(base["facts"], device, diagnoses, cores, only)
        result["untried"] = untried(base["report"] or {}, trials)
        _say(f"{len(trials)} trial(s) of about {base['wall_s']:.0f} s each: "
             f"{', '.join(t['knob'] for t in trials) or 'none'}"
             + (f"; skipped: {', '.join(s['knob'] for s in result['skipped'])}" if result["skipped"] else ""))
        bases, done = [base], []
        for index, candidate in enumerate(trials, 1):
            running = candidate["knob"]
            _say(f"trial {index}/{len(trials)} {candidate['knob']}: started ({candidate['change']})")
            if candidate["knob"] == "eval_batch":  # timed per evaluation, against the batch as it is
                entry = _evaluation_trial(tuner, candidate)
                result["trials"].append(entry)
                _say(f"trial {index}/{len(trials)} eval_batch: {entry['status']}"
                     + (f", {entry['speedup']:.2f}x per evaluation" if entry.get("speedup") else ""))
                continue
            outcome = tuner.trial(candidate["knob"], candidate["knobs"])
            entry = _trial_entry(candidate, outcome, bases, device, job)
            done.append((candidate, outcome))
            result["trials"].append(entry)
            _say(f"trial {index}/{len(trials)} {candidate['knob']}: " + (
                f"{entry['speedup']:.2f}x against the first baseline run ({outcome['wall_s']:.0f} s; the table "
                "takes the baseline run again after the trials too)" if entry["status"] == "measured"
                and entry["speedup"] is not None else f"{entry['status']}: {entry.get('error')}"))
        if any(outcome["status"] == "measured" for _, outcome in done):
            # the baseline again: a machine that changed while the trials ran widens every interval
            running = "baseline_after"
            _say("the baseline again, after the trials: what the machine did meanwhile goes into each interval")
            after = tuner.trial("baseline_after", {})
            if after["status"] == "measured":
                bases.append(after)
                result["trials"] = [entry for entry in result["trials"] if entry.get("measured_on")] + [
                    _trial_entry(candidate, outcome, bases, device, job) for candidate, outcome in done]
            else:
                _say(f"the second baseline {after['status']}: the intervals are against the first alone")
            result["baseline"]["blocks"] = [_block(entry) for entry in bases]
            _baseline_drift(result["baseline"])
            if len(bases) > 1:  # the figures the table gives, said where the progress lines said the first ones
                _say("against both baseline runs: " + ", ".join(
                    f"{entry['knob']} {entry['speedup']:.2f}x" for entry in result["trials"]
                    if entry["status"] == "measured" and entry["speedup"] is not None))
    except KeyboardInterrupt:
        _say(f"interrupted during the {running} trial: the trials done so far")
        result["interrupted"] = {"during": running}
        status = 130
    finally:
        result["trials"] = ranked(result["trials"])
        _save(result, Path(output_dir), work)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2, default=str) if output == "json" else format_table(result), file=out())
    return status


def _baseline_entry(base: dict[str, Any]) -> dict[str, Any]:
    steady = steady_steps_ms(base["report"])
    p50 = bootstrap_interval(steady) if steady else None

    throughput = base["report"].get("throughput") or {}
    return {"step_ms": round(statistics.fmean(steady), 4) if steady else None,
            "p50_ms": round(p50[0], 4) if p50 else None,
            "p50_interval": [round(p50[1], 4), round(p50[2], 4)] if p50 else None, "steps": len(steady),
            "samples_per_s": throughput.get("samples_per_s"), "tokens_per_s": throughput.get("tokens_per_s"),
            "stopped": base["stopped"], "facts": base["facts"], "wall_s": base["wall_s"],
            "diagnoses": [d["id"] for d in base["report"].get("diagnoses") or []], "losses": base["losses"]}


def _block(base: dict[str, Any]) -> dict[str, Any]:
    """One run of the baseline: its mean steady step (ms), the number of steps and how long it ran (s)."""
    steady = steady_steps_ms(base["report"])
    return {"step_ms": round(statistics.fmean(steady), 4) if steady else None, "steps": len(steady),
            "wall_s": base["wall_s"]}


def _baseline_drift(baseline: dict[str, Any]) -> None:
    """``drift``: the last baseline block's mean step over the first's, minus 1 (0.3: 30% slower after the
    trials than before them)."""
    blocks = [block for block in baseline.get("blocks") or [] if block.get("step_ms")]
    if len(blocks) < 2:
        return
    baseline["drift"] = round(blocks[-1]["step_ms"] / blocks[0]["step_ms"] - 1, 4)


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value > 0 else None


def _trial_entry(candidate: dict[str, Any], outcome: dict[str, Any], bases: list[dict[str, Any]],
                 device: str | None, job_steps: int | None = None) -> dict[str, Any]:
    entry = {key: candidate[key] for key in ("knob", "title", "change", "named_by", "keeps_numerics")}
    entry.update(numerics="unchanged" if candidate["keeps_numerics"] else "changed", status=outcome["status"],
                 wall_s=outcome["wall_s"], stopped=outcome["stopped"])
    if outcome["status"] != "measured":
        return {**entry, "error": outcome.get("error"), "speedup": None, "interval": None}
    figures = measure(bases, outcome, job_steps)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    suspect = flags(candidate["knob"], figures, candidate["named_by"], ceilings(bases[0]["report"]),
                    [base["report"] for base in bases], outcome["report"], device,
                    crowded=oversubscribed(candidate["knobs"], bases[0]["report"], cores))
    return {**entry, **figures, "flags": suspect, "report": outcome["report"]}


def _per_evaluation_s(outcome: dict[str, Any]) -> float | None:
    run = (outcome.get("report") or {}).get("run") or {}
    count = int(run.get("evaluations") or 0)
    return float(run["evaluation_s"]) / count if count and run.get("evaluation_s") else None


def _evaluation_trial(tuner: Tuner, candidate: dict[str, Any]) -> dict[str, Any]:
    """The evaluation batch, timed per evaluation: two trials that evaluate inside their steps (every
    ``eval_every`` steps), one with the batch as the script has it, one with the candidate's; the speedup is the
    first's seconds per evaluation over the second's."""
    every = max(1, (WARMUP_STEPS + tuner.steps) // 2)
    entry = {key: candidate[key] for key in ("knob", "title", "change", "named_by", "keeps_numerics")}
    entry.update(numerics="unchanged", measured_on="seconds per evaluation", interval=None)
    base = tuner.trial("eval_batch_as_is", {"eval_every": every})
    trial = tuner.trial("eval_batch", {**candidate["knobs"], "eval_every": every})
    before, after = _per_evaluation_s(base), _per_evaluation_s(trial)
    if base["status"] != "measured" or trial["status"] != "measured" or not before or not after:
        why = base.get("error") or trial.get("error") or "no evaluation ran inside the trials' steps"
        return {**entry, "status": "failed", "error": why, "speedup": None, "wall_s": trial["wall_s"]}
    return {**entry, "status": "measured", "speedup": round(before / after, 4), "base_ms": round(before * 1e3, 3),
            "trial_ms": round(after * 1e3, 3), "wall_s": round(base["wall_s"] + trial["wall_s"], 2),
            "stopped": trial["stopped"], "flags": [], "loss_delta": {"steps": 0, "max_abs": None, "mean": None,
                                                                      "identical": None}}


def _save(result: dict[str, Any], output_dir: Path, work: Path) -> None:
    """``tune.json``, and each trial's ``report.json`` and logs (``stdout.txt``, ``stderr.txt``, a failed one's
    too) under ``output_dir/trials``; the reports leave the result."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        losses = measured_losses(result["trials"])
        for folder in sorted(work.iterdir()) if work.is_dir() else []:
            kept = output_dir / "trials" / folder.name
            for source in (folder / "perfhooks" / "report.json", folder / "stdout.txt", folder / "stderr.txt"):
                if source.is_file():
                    kept.mkdir(parents=True, exist_ok=True)
                    shutil.copy(source, kept / source.name)
            report = read_json_object(kept / "report.json") if losses and folder.name == "baseline" else None
            if report is not None:  # the baseline's verdicts whose fix measured as a loss say so
                (kept / "report.json").write_text(json.dumps(mark_losses(report, losses), indent=2))
        for entry in result["trials"]:
            entry.pop("report", None)
        (output_dir / "tune.json").write_text(json.dumps(result, indent=2, default=str))
    except OSError as error:
        _say(f"could not write {output_dir / 'tune.json'} ({error})")


def _say(message: str) -> None:
    print(f"perfhooks tune: {message}", file=sys.stderr, flush=True)


def check_only(text: str | None) -> tuple[str, ...]:
    """``--only bf16,compile`` -> the knob names; an unknown one is an error naming the allowed."""
    if not text:
        return ()
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in KNOB_NAMES]
    if unknown:
        raise ValueError(f"--only takes knob names among {', '.join(KNOB_NAMES)}; got {', '.join(unknown)}")
    return names
