"""``perfhooks analyze PATH...``: what holds a training run back, from its torch.profiler traces.

Exit status: 0 on success, 2 on bad input (one line on stderr naming the file and the problem).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from perfhooks.cli.machine import machine_output, out


def _analyze(args: argparse.Namespace) -> int:
    from perfhooks.analysis.trace import TraceError
    from perfhooks.offline.analyze import analyze_paths
    from perfhooks.rules.thresholds import Thresholds

    if args.idle:
        _on_idle_cpu()
    try:
        thresholds = Thresholds(**json.loads(args.thresholds)) if args.thresholds else None
    except (ValueError, TypeError) as error:
        print(f"perfhooks: --thresholds: {error}", file=sys.stderr)
        return 2
    share = args.last_step_share
    if share is not None and not 0 < share <= 1:
        print(f"perfhooks: --last-step-share must be above 0 and at most 1, got {share:g}", file=sys.stderr)
        return 2
    if args.paths and all(str(path).endswith(".pickle") for path in args.paths):
        return _analyze_snapshots(args)
    try:
        report = analyze_paths(args.paths, workers=args.workers, thresholds=thresholds, last_step_share=share)
    except TraceError as error:
        print(f"perfhooks: {error}", file=sys.stderr)
        return 2
    if args.format == "json":
        from perfhooks.report.schema import json_safe

        replaced: list[str] = []
        report = json_safe(report, replaced=replaced)
        if replaced:
            report.setdefault("warnings", []).append(
                f"{len(replaced)} figure(s) were not finite numbers (the trace holds implausible values) and are "
                f"null: {', '.join(replaced[:5])}")
        text = json.dumps(report, indent=2, default=str, allow_nan=False)
    elif args.format == "html":
        from perfhooks.sinks.html import render_html

        text = render_html(report, series=report.get("series"),
                           base=Path(args.output).parent if args.output else Path.cwd())
    else:
        from perfhooks.sinks.text import format_analysis

        text = format_analysis(report)
    return _emit(text, args.output)


def _on_idle_cpu() -> None:
    """This process runs only when a CPU would otherwise idle (``SCHED_IDLE``), or at the lowest nice where the OS
    has no such class; as it was where neither can be set."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.nice(19 - os.nice(0))


def _analyze_snapshots(args: argparse.Namespace) -> int:
    """``perfhooks analyze snapshot.pickle``: a memory snapshot, read with a data-only unpickler and summarized."""
    from perfhooks.analysis.snapshot import SnapshotError, format_snapshot, load_snapshot, summarize_snapshot

    summaries = {}
    for path in args.paths:
        try:
            summaries[str(path)] = summarize_snapshot(load_snapshot(path))
        except SnapshotError as error:
            print(f"perfhooks: {error}", file=sys.stderr)
            return 2
    if args.format == "json":
        return _emit(json.dumps(summaries, indent=2), args.output)
    return _emit("\n".join(f"{path}\n{format_snapshot(summary)}" for path, summary in summaries.items()), args.output)


def _emit(text: str, output: str | None) -> int:
    """``text`` to the ``--output`` file (atomically) or to standard output."""
    from perfhooks.files.atomic import atomic_write_bytes

    if output:
        atomic_write_bytes(Path(output), (text + "\n").encode())
    else:
        print(text, file=out())
    return 0


def _report(args: argparse.Namespace) -> int:
    """Regenerate ``report.html`` from the ``report*.json`` files in an output folder (each checked against the
    report's contract first: one that breaks it gets one line and exit 2)."""
    from perfhooks.files.atomic import atomic_write_bytes
    from perfhooks.report.schema import validate_report
    from perfhooks.sinks.html import render_html

    folder = Path(args.output_dir)
    reports = sorted(folder.glob("report*.json")) if folder.is_dir() else []
    if not reports:
        print(f"perfhooks: {folder}: no report.json found", file=sys.stderr)
        return 2
    for path in reports:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            print(f"perfhooks: {path}: unreadable report ({error})", file=sys.stderr)
            return 2
        problems = validate_report(report) if isinstance(report, dict) else ["not a JSON object"]
        if problems:
            print(f"perfhooks: {path}: not a perfhooks report ({'; '.join(problems[:3])})", file=sys.stderr)
            return 2
        atomic_write_bytes(path.with_suffix(".html"),
                           render_html(report, series=report.get("series"), base=path.parent).encode())
        print(path.with_suffix(".html"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfhooks", description="Make a PyTorch training run explain its "
                                     "own performance.")
    from perfhooks import __version__

    parser.add_argument("--version", action="version", version=f"perfhooks {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    analyze = commands.add_parser("analyze", help="analyse torch.profiler traces (files or folders)")
    analyze.add_argument("paths", nargs="+", help="trace files (.json, .json.gz) or folders; a folder of per-rank "
                         "traces is one multi-rank run")
    analyze.add_argument("--format", choices=("text", "json", "html"), default="text")
    analyze.add_argument("--output", "-o", help="write here instead of standard output")
    analyze.add_argument("--workers", type=int, default=None, help="processes for multi-rank folders")
    analyze.add_argument("--thresholds", default=None, help="diagnosis thresholds as JSON, e.g. "
                         "'{\"gpu_utilization\": 0.5}' (fields of perfhooks.Thresholds)")
    analyze.add_argument("--idle", action="store_true", help="run on idle CPU only (Linux's SCHED_IDLE; elsewhere "
                         "the lowest nice): what a training run's own window analysis uses, beside its steps")
    analyze.add_argument("--last-step-share", type=float, default=None, help="the share (0..1) of its micro-batches "
                         "the trace's last step holds (a window stopped inside it); the per-step figures weigh it so")
    analyze.set_defaults(run=_analyze)
    report = commands.add_parser("report", help="regenerate report.html in a perfhooks output folder")
    report.add_argument("output_dir")
    report.set_defaults(run=_report)
    diff = commands.add_parser("diff", help="compare two runs: reports, output folders or traces")
    diff.add_argument("before", help="report.json, a perfhooks output folder, or trace file(s)/folder")
    diff.add_argument("after", help="the same kinds as BEFORE")
    diff.add_argument("--format", choices=("text", "json", "html"), default="text")
    diff.add_argument("--output", "-o", help="write here instead of standard output")
    diff.add_argument("--gate", type=float, default=None, metavar="PCT",
                      help="exit 1 when AFTER's steady step is more than PCT percent slower than BEFORE's and outside "
                      "both runs' noise (bootstrap intervals of the median), 0 when not, 2 when the runs are not "
                      "comparable (framework, device, world size, samples per step or precision differ)")
    diff.add_argument("--force", action="store_true", help="with --gate: compare runs that are not comparable")
    diff.set_defaults(run=_diff)
    merge = commands.add_parser(
        "merge-traces", help="merge the ranks' traces of one window into one timeline (Perfetto, HTA)",
        description="Merge the ranks' traces of one capture window into one Chrome trace: one process per rank, "
        "named 'rank N (host)', clocks aligned across hosts from a collective's end (the offsets are in the "
        "trace's perfhooksMerge metadata). perfhooks analyze reads it as the ranks' own traces.")
    merge.add_argument("paths", nargs="+", metavar="FOLDER_OR_TRACE", help="each rank's trace file, or folders "
                       "holding them (perfhooks output folders: each rank's latest window)")
    merge.add_argument("-o", "--output", required=True, help="the merged trace (.json.gz or .json)")
    merge.add_argument("--step", type=int, default=None, help="the window that starts at this step "
                       "(rank<R>.step<N> files); default: each rank's latest")
    merge.add_argument("--aligned-steps", action="store_true", help="keep only the steps every rank recorded")
    merge.add_argument("--max-bytes", type=int, default=512 * 2**20, help="the most the output may take; steps "
                       "are dropped from the end to stay under it (default 512 MiB, as max_trace_bytes)")
    merge.set_defaults(run=_merge_traces)
    _add_job_commands(commands)
    return parser


def _add_job_commands(commands: Any) -> None:
    """The commands that reach a job or this machine: top, mcp, doctor, wandb-workspace, run."""
    top = commands.add_parser("top", help="a live view of a running job's ranks (their live.rank*.json files)")
    top.add_argument("folders", nargs="*", default=["."], metavar="DIR", help="output folders (one per node, or a "
                     "shared one; default: here)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--json", action="store_true", help="print one frame as JSON and exit")
    top.set_defaults(run=_top)
    agents = commands.add_parser("mcp", help="an MCP server on stdio for agents: list runs, read diagnoses and live "
                                 "status, open a window on a running job, analyze, diff (pip install "
                                 "'perfhooks[mcp]')")
    agents.add_argument("--root", default=".", metavar="DIR", help="the folder the server may read (every path a "
                        "tool takes is inside it; it writes only a run's TRIGGER; default: here)")
    agents.set_defaults(run=_mcp)
    check = commands.add_parser("doctor", help="check this machine, its device and frameworks for perfhooks "
                                "(a table of pass/warn/fail/skip; exit 1 when a check failed)")
    check.add_argument("--device", default=None, help="the device to check, e.g. cuda:1 (default: the current one)")
    check.add_argument("--format", choices=("text", "json"), default="text", help="a table, or JSON for a bug "
                       "report")
    check.add_argument("-o", "--output", default=None, metavar="FILE", help="also write the JSON to FILE")
    check.set_defaults(run=_doctor)
    view = commands.add_parser("wandb-workspace", help="save a W&B workspace view of perfhooks' panels "
                               "(needs wandb-workspaces: pip install 'perfhooks[workspace]')")
    view.add_argument("project", metavar="ENTITY/PROJECT")
    view.add_argument("--name", default="perfhooks", help="the view's name (default: perfhooks)")
    view.add_argument("--dry-run", action="store_true", help="print the view as JSON; save nothing, need no server")
    view.set_defaults(run=_wandb_workspace)
    launch = commands.add_parser(
        "run", allow_abbrev=False, help="run a training script unmodified, with perfhooks added to its "
        "Lightning Trainer, transformers Trainer or Accelerator",
        description="perfhooks run [OPTIONS] SCRIPT [ARGS...] runs SCRIPT as `python SCRIPT ARGS` would. Every "
        "perfhooks.PerfConfig setting is an option (--max-traces 3, --no-console, --memory-threshold 0.8, ...) "
        "and an environment variable (PERFHOOKS_MAX_TRACES=3); options go before SCRIPT.")
    from perfhooks.cli.launch import add_setting_options

    add_setting_options(launch)
    launch.add_argument("--add-to-trainer-logs", action="store_true",
                        help="transformers only: add the perf/* figures to the Trainer's training logs, so that every "
                        "report_to tracker and its printed lines get them (default: the Trainer's logs are its own)")
    launch.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m does")
    launch.add_argument("target", metavar="SCRIPT", help="the training script (or module, with -m)")
    launch.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's own arguments")
    launch.set_defaults(run=_run)
    tune = commands.add_parser(
        "tune", allow_abbrev=False, help="try the fixes perfhooks' diagnoses name on a training script, a trial "
        "each, and rank them by measured speedup",
        description="perfhooks tune [OPTIONS] SCRIPT [ARGS...] runs SCRIPT under the launcher once as a baseline, "
        "then once per change that applies (DataLoader workers, TF32, bf16, torch.compile, SDPA, anomaly detection "
        "off, threads), each set at the framework's own seam, and reports each one's measured steady-step speedup, "
        "its one-time cost and the steps that take to repay, and the loss difference. The "
        "script's checkpoints, logs and W&B runs are left alone: trials write into temporary folders.")
    add_setting_options(tune)
    for action in tune._actions:  # tune's own folder: tune.json and each trial's report (not a run's output)
        if action.dest == "output_dir":
            action.help = "folder for tune.json and each trial's report and log under trials/ (default: perfhooks_tune)"
    tune.add_argument("--steps", type=int, default=40, help="steady steps measured per trial, after 3 warm-up "
                      "steps (default 40)")
    tune.add_argument("--only", default=None, metavar="KNOBS", help="comma-separated knobs to try, among "
                      "dataloader_workers, tf32, bf16, compile, sdpa, anomaly_off, threads (default: every one that "
                      "applies)")
    tune.add_argument("--job-steps", type=int, default=None, metavar="N", help="the real job's length in optimizer "
                      "steps, which a change's one-time cost (compilation) is held against (default: the framework's "
                      "max_steps where the script sets it, else each trial's own length)")
    tune.add_argument("--format", choices=("text", "json"), default="text")
    tune.add_argument("--max-trial-s", type=float, default=600.0, help="seconds a trial may run before it is "
                      "stopped and reported as timed out (default 600)")
    tune.add_argument("target", metavar="SCRIPT", help="the training script")
    tune.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's own arguments")
    tune.set_defaults(run=_tune)


def _doctor(args: argparse.Namespace) -> int:
    from perfhooks.cli.doctor import run

    if args.device is not None and not args.device.startswith(("cuda", "cpu")):
        print(f"perfhooks doctor: --device must be cuda, cuda:N or cpu, got {args.device!r}", file=sys.stderr)
        return 2
    return run(None if args.device in (None, "cpu") else args.device, args.format, args.output)


def _mcp(args: argparse.Namespace) -> int:
    from perfhooks.cli.mcp_server import serve

    return serve(args.root)


def _top(args: argparse.Namespace) -> int:
    from perfhooks.cli.top import run

    return run(args.folders, once=args.once, as_json=args.json)


def _diff(args: argparse.Namespace) -> int:
    from perfhooks.analysis.trace import TraceError
    from perfhooks.offline.diff import compare, format_html, format_text, load_side
    from perfhooks.offline.gate import format_gate, gate
    from perfhooks.report.schema import json_safe

    if args.gate is not None and not (args.gate >= 0):
        print(f"perfhooks diff: --gate must be a percentage >= 0, got {args.gate}", file=sys.stderr)
        return 2
    try:
        before, after = load_side(args.before), load_side(args.after)
        result = compare(before, after)
    except TraceError as error:
        print(f"perfhooks: {error}", file=sys.stderr)
        return 2
    gated = gate(before["report"], after["report"], args.gate, args.force) if args.gate is not None else None
    if gated is not None:
        result = {"verdict": gated["verdict"], "gate": gated, **result}
    if args.format == "json":
        text = json.dumps(json_safe(result), indent=2, allow_nan=False)
    elif args.format == "html":
        text = format_html(result)
    else:
        text = format_text(result) + ("\n" + format_gate(gated) if gated is not None else "")
    status = _emit(text, args.output)
    return gated["exit"] if gated is not None and status == 0 else status


def _merge_traces(args: argparse.Namespace) -> int:
    from perfhooks.analysis.merge_traces import merge_traces
    from perfhooks.analysis.trace import TraceError

    if args.max_bytes <= 0:
        print(f"perfhooks merge-traces: --max-bytes must be a positive number of bytes, got {args.max_bytes}",
              file=sys.stderr)
        return 2
    try:
        result = merge_traces(args.paths, args.output, aligned_steps=args.aligned_steps, max_bytes=args.max_bytes,
                              step=args.step)
    except TraceError as error:
        print(f"perfhooks merge-traces: {error}", file=sys.stderr)
        return 2
    for warning in result.warnings:
        print(f"perfhooks merge-traces: {warning}", file=sys.stderr)
    steps = f"steps {result.steps[0]}-{result.steps[-1]}" if result.steps else "no common step"
    print(f"{result.path}: ranks {', '.join(map(str, result.ranks))}, {steps}, {result.bytes} bytes")
    for rank, offset in sorted(result.offsets.items()):
        if offset.method != "reference":
            estimate = "unknown" if offset.estimated_us is None else f"{offset.estimated_us / 1e3:+.3f} ms"
            print(f"  rank {rank}: clock offset {estimate} ({offset.method}, {offset.matches} matches), "
                  f"applied {offset.applied_us / 1e3:+.3f} ms")
    return 0


def _wandb_workspace(args: argparse.Namespace) -> int:
    from perfhooks.sinks.wandb_workspace import build_workspace, workspace_json

    entity, slash, project = args.project.partition("/")
    if not slash or not entity or not project or "/" in project:
        print(f"perfhooks wandb-workspace: ENTITY/PROJECT must be like my-team/my-project, got {args.project!r}",
              file=sys.stderr)
        return 2
    try:
        workspace = build_workspace(entity, project, args.name)
    except RuntimeError as error:
        print(f"perfhooks wandb-workspace: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(workspace_json(workspace), indent=2), file=out())
        return 0
    import wandb.errors

    try:
        workspace.save()
    except (wandb.errors.UsageError, wandb.errors.AuthenticationError) as error:
        print(f"perfhooks wandb-workspace: not logged in to W&B ({str(error).splitlines()[0]}): run `wandb login` "
              "or set WANDB_API_KEY; --dry-run prints the view without a login", file=sys.stderr)
        return 2
    except wandb.errors.CommError as error:
        print(f"perfhooks wandb-workspace: W&B refused the view for {args.project} "
              f"({str(error).splitlines()[0] if str(error) else type(error).__name__})", file=sys.stderr)
        return 2
    print(workspace.url)
    return 0


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from perfhooks.cli.launch import run, settings_from, start_script_interpreter

    try:
        settings = settings_from(args)
    except (ValueError, TypeError) as error:
        print(f"perfhooks run: {error}", file=sys.stderr)
        return 2
    if args.command_line is not None and (args.module or Path(args.target).is_file()):
        # returns only where it cannot: the script then runs in this process
        start_script_interpreter(args.command_line, [args.target, *args.arguments])
    return run(args.target, args.arguments, settings, module=args.module,
               transformers_options=transformers_options(args))


def launched_script() -> Any:
    """In the interpreter :func:`~perfhooks.cli.launch.start_script_interpreter` started (its program,
    ``perfhooks.cli.launch.BOOT``, calls this): ``perfhooks run``'s arguments read back (the variable removed), and
    the script set up to run in the caller's frame (a :class:`~perfhooks.cli.launch.LaunchedScript`). The ``''``
    that ``-c`` put first on the path goes: the script's folder takes its place, as under python SCRIPT."""
    from perfhooks.cli.launch import ARGV_VARIABLE, LaunchedScript, settings_from

    argv = json.loads(os.environ.pop(ARGV_VARIABLE))
    if sys.path and sys.path[0] == "":
        del sys.path[0]
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except (ValueError, TypeError) as error:  # checked before the exec: not expected here
        print(f"perfhooks run: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return LaunchedScript(args.target, args.arguments, settings, module=args.module,
                          transformers_options=transformers_options(args))


def transformers_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``perfhooks run``'s arguments of PerfTrainerCallback that are not settings."""
    return {"add_to_trainer_logs": True} if args.add_to_trainer_logs else None


def _tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from perfhooks.cli.launch import settings_environment, settings_from
    from perfhooks.cli.tune import check_only, run_tune

    try:
        settings_from(args)
        only = check_only(args.only)
        if args.steps < 5:
            raise ValueError(f"--steps must be an integer >= 5, got {args.steps}")
        if args.job_steps is not None and args.job_steps < 1:
            raise ValueError(f"--job-steps must be an integer >= 1, got {args.job_steps}")
        if not args.max_trial_s > 0:
            raise ValueError(f"--max-trial-s must be a number of seconds > 0, got {args.max_trial_s}")
        if not Path(args.target).is_file():
            raise ValueError(f"{args.target}: no such script")
    except (ValueError, TypeError) as error:
        print(f"perfhooks tune: {error}", file=sys.stderr)
        return 2
    return run_tune(args.target, args.arguments, settings_environment(args), args.steps, only, args.format,
                    args.max_trial_s, args.output_dir or "perfhooks_tune", job_steps=args.job_steps)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    #: The process's own command line (``argv`` None): ``perfhooks run`` may then start a fresh interpreter.
    args.command_line = sys.argv[1:] if argv is None else None
    with machine_output(getattr(args, "format", None) == "json" or getattr(args, "json", False) is True):
        return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
