"""``perfhooks mcp [--root DIR]``: an MCP server on stdio that lets an agent read finished and running jobs.

Built on the ``mcp`` SDK (the ``perfhooks[mcp]`` extra). Every path a tool takes is resolved inside ``--root``
(default: the working folder); one outside it, or one that is not a perfhooks folder or trace, gets an error that
names it. The server writes one file, ever: ``TRIGGER`` in a run's own output folder (``open_window``).

Tools: ``list_runs``, ``run_summary``, ``diagnoses``, ``live_status``, ``open_window``, ``analyze``, ``diff``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from perfhooks.capture.trigger import TRIGGER_FILE
from perfhooks.files.atomic import read_json_object

#: Folders ``list_runs`` looks through, at most, and runs it returns.
MAX_DEPTH, MAX_RUNS = 6, 200
#: What an agent reads first (the server's instructions to its client).
INSTRUCTIONS = (
    "perfhooks explains a PyTorch training run's performance. Call list_runs on a folder first, then "
    "run_summary or diagnoses on a run. A diagnosis is a verdict: its evidence is measured, its estimated_gain is a "
    "ceiling (the most of the step the fix can save) and cost is that ceiling in device-hours. For a job still "
    "running, live_status tells where each rank is; open_window records a profiler window on its next steps. "
    "analyze reads a torch.profiler trace; diff compares two runs and gates a regression.")


class PathRefused(ValueError):
    """A path a tool may not read: outside the root, missing, or not what the tool reads."""


class Runs:
    """The tools' logic over one root folder (no MCP in here, so that it is tested and reused directly)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise PathRefused(f"--root {root}: not a folder")

    # ------------------------------------------------------------------ paths
    def _inside(self, path: str, what: str) -> Path:
        resolved = (self.root / path).resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise PathRefused(f"{what} {path!r} is outside the folder this server reads ({self.root})")
        if not resolved.exists():
            raise PathRefused(f"{what} {path!r}: no such file or folder under {self.root}")
        return resolved

    def run_folder(self, path: str) -> Path:
        """A perfhooks output folder: one with ``report.json``, ``report.rank<R>.json`` or ``live.rank<R>.json``."""
        folder = self._inside(path, "run")
        if folder.is_file() and folder.name.startswith(("report", "live.rank")):
            folder = folder.parent
        if not folder.is_dir() or not _is_run_folder(folder):
            raise PathRefused(f"run {path!r} is not a perfhooks output folder (no report.json, report.rank<R>.json "
                              f"or live.rank<R>.json in it); list_runs names them")
        return folder

    def _report(self, path: str) -> tuple[Path, dict[str, Any]]:
        folder = self.run_folder(path)
        report = _first_report(folder)
        if report is not None:
            return folder, report
        raise PathRefused(f"run {path!r} has no readable report yet (it may have just started: try live_status)")

    # ------------------------------------------------------------------ tools
    def list_runs(self, folder: str = ".") -> list[dict[str, Any]]:
        """Every perfhooks run under ``folder``: path, status, framework, steps, step ms, top diagnosis."""
        base = self._inside(folder, "folder")
        if not base.is_dir():
            raise PathRefused(f"folder {folder!r} is not a folder")
        runs = []
        for candidate in _folders(base, MAX_DEPTH):
            if not _is_run_folder(candidate):
                continue
            entry: dict[str, Any] = {"run": str(candidate.relative_to(self.root))}
            report = _first_report(candidate)
            if report:
                diagnoses = report.get("diagnoses") or []
                entry.update({"status": report.get("status"), "framework": report.get("framework"),
                              "steps": report.get("steps"), "step_ms": (report.get("step_ms") or {}).get("mean"),
                              "updated_at": report.get("updated_at"),
                              "top_diagnosis": diagnoses[0]["id"] if diagnoses else None})
            else:
                entry["status"] = "running (no report yet)"
            runs.append(entry)
            if len(runs) >= MAX_RUNS:
                break
        if not runs:  # an empty list reaches the client as no content at all: say what was looked for
            raise PathRefused(f"no perfhooks run under folder {folder!r} (a run's folder holds report.json or "
                              f"live.rank<R>.json; {MAX_DEPTH} levels down were searched)")
        return runs

    def run_summary(self, run: str) -> dict[str, Any]:
        """A run's headline: status, steps, step and phase figures, throughput, the ledger and its verdicts."""
        folder, report = self._report(run)
        keys = ("status", "framework", "world_size", "device", "steps", "global_step", "step_ms", "coverage",
                "throughput", "run", "ledger", "error", "signal")
        summary = {key: report[key] for key in keys if key in report}
        summary["run"] = str(folder.relative_to(self.root))
        summary["phases"] = {name: {"mean_ms": p.get("mean_ms"), "share": p.get("share")}
                             for name, p in (report.get("phases") or {}).items()}
        summary.get("throughput", {}).pop("waterfall", None)
        summary["diagnoses"] = [{key: d.get(key) for key in ("id", "severity", "title", "estimated_gain", "cost")}
                                for d in report.get("diagnoses") or []]
        return summary

    def diagnoses(self, run: str) -> list[dict[str, Any]]:
        """A run's diagnoses, ranked: id, severity, title, evidence, estimated gain, cost, fix and docs."""
        _, report = self._report(run)
        keys = ("id", "severity", "title", "evidence", "estimated_gain", "gain_basis", "cost", "recommendation",
                "docs", "rank", "step")
        return [{key: d[key] for key in keys if key in d} for d in report.get("diagnoses") or []]

    def live_status(self, run: str) -> dict[str, Any]:
        """Where a running job's ranks are now (their live files), or, where it wrote none, its latest report."""
        from perfhooks.cli.top import live_files, read_frame

        folder = self.run_folder(run)
        report = _first_report(folder)
        ended = report is not None and report.get("status") not in (None, "running")
        if live_files([str(folder)]) and not ended:
            return {"source": "live files", **read_frame([str(folder)])}
        if report is None:
            raise PathRefused(f"run {run!r} has neither live files nor a report")
        age = time.time() - float(report.get("updated_at") or 0.0)
        return {"source": "report", "status": report.get("status"), "steps": report.get("steps"),
                "step_ms": report.get("step_ms"), "updated_s_ago": round(age, 1),
                "diagnoses": [d["id"] for d in report.get("diagnoses") or []]}

    def open_window(self, run: str) -> dict[str, Any]:
        """Touch ``TRIGGER`` in a run's folder: the job records a profiler window over its next steps (on every
        rank) and deletes the file. The only file this server writes."""
        folder = self.run_folder(run)
        trigger = folder / TRIGGER_FILE
        trigger.touch()
        report = _first_report(folder) or {}
        note = "" if report.get("status") in (None, "running") else (
            f" The run's report says {report.get('status')!r}: a finished run will not see it.")
        return {"trigger": str(trigger.relative_to(self.root)),
                "message": "The job records a window at its next trigger poll (about a second); its diagnoses "
                           f"arrive in the report when the window is analysed.{note}"}

    def analyze(self, trace: str) -> dict[str, Any]:
        """``perfhooks analyze`` on a trace file or a folder of one run's per-rank traces: its figures and
        diagnoses."""
        from perfhooks.analysis.trace import TraceError
        from perfhooks.offline.analyze import analyze_paths
        from perfhooks.report.schema import json_safe

        path = self._inside(trace, "trace")
        try:
            report = analyze_paths([path])
        except TraceError as error:
            raise PathRefused(f"trace {trace!r}: {error}") from None
        metrics = report.get("metrics") or {}
        keep = ("step_us", "steps", "gpu_utilization", "device", "warnings")
        return json_safe({"source": str(path.relative_to(self.root)), "device": report.get("device"),
                          "metrics": {key: metrics[key] for key in keep if key in metrics},
                          "ranks": {k: v for k, v in (report.get("ranks") or {}).items() if k != "per_rank"},
                          "warnings": report.get("warnings") or [],
                          "diagnoses": self._verdicts(report)})

    def diff(self, before: str, after: str, gate_percent: float = 5.0, force: bool = False) -> dict[str, Any]:
        """``perfhooks diff BEFORE AFTER --gate PCT``: the gate's verdict (regressed, improved, unchanged,
        not_comparable) with its intervals and reasons, and the comparison."""
        from perfhooks.analysis.trace import TraceError
        from perfhooks.offline.diff import compare, load_side
        from perfhooks.offline.gate import gate
        from perfhooks.report.schema import json_safe

        if not gate_percent >= 0:
            raise PathRefused(f"gate_percent must be a percentage >= 0, got {gate_percent!r}")
        try:
            sides = [load_side(self._inside(path, name)) for name, path in (("before", before), ("after", after))]
        except TraceError as error:
            raise PathRefused(str(error)) from None
        gated = gate(sides[0]["report"], sides[1]["report"], gate_percent, force)
        result = compare(*sides)
        result.pop("operators", None)
        result.pop("kernels", None)
        return json_safe({"verdict": gated["verdict"], "gate": gated, **result})

    @staticmethod
    def _verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
        keys = ("id", "severity", "title", "evidence", "estimated_gain", "recommendation", "rank")
        return [{key: d[key] for key in keys if key in d} for d in report.get("diagnoses") or []]


def _first_report(folder: Path) -> dict[str, Any] | None:
    """The run's merged ``report.json``, else its lowest rank's readable ``report.rank<R>.json``, else None."""
    candidates = [folder / "report.json", *sorted(folder.glob("report.rank*.json"))]
    return next((report for report in map(read_json_object, candidates) if report is not None), None)


def _is_run_folder(folder: Path) -> bool:
    return (folder / "report.json").is_file() or any(folder.glob("report.rank*.json")) \
        or any(folder.glob("live.rank*.json"))


def _folders(base: Path, depth: int) -> list[Path]:
    """``base`` and the folders under it, at most ``depth`` deep, in a stable order (no symlinked folder)."""
    found, level = [base], [base]
    for _ in range(depth):
        level = sorted(child for folder in level for child in _children(folder))
        found.extend(level)
    return found


def _children(folder: Path) -> list[Path]:
    try:
        return [child for child in folder.iterdir() if child.is_dir() and not child.is_symlink()
                and child.name not in ("traces", "memory", "oom", "merged")]
    except OSError:
        return []


def build_server(root: str | Path) -> Any:
    """The MCP server over ``root`` (needs the ``mcp`` SDK)."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    runs = Runs(root)
    from perfhooks import __version__

    server = MCPServer("perfhooks", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def tool(method: Any) -> None:
        required = _required(method)

        def call(**kwargs: Any) -> Any:
            missing = [name for name in required if kwargs.get(name) is None]
            if missing:  # said here, in words: the SDK's own check answers with a pydantic dump
                raise ToolError(f"{method.__name__} needs {', '.join(repr(name) for name in missing)} "
                                f"(required: {', '.join(required)}); see the tool's description")
            try:
                return method(**kwargs)
            except PathRefused as error:
                raise ToolError(str(error)) from None

        description = f"{method.__doc__} Required: {', '.join(required)}." if required else method.__doc__
        call.__name__, call.__doc__ = method.__name__, description
        call.__signature__ = _signature(method, optional=True)  # type: ignore[attr-defined]
        server.add_tool(call, name=method.__name__, description=description)

    for method in (runs.list_runs, runs.run_summary, runs.diagnoses, runs.live_status, runs.open_window,
                   runs.analyze, runs.diff):
        tool(method)
    return server


def _required(method: Any) -> list[str]:
    import inspect

    return [p.name for p in inspect.signature(method).parameters.values() if p.default is inspect.Parameter.empty]


def _signature(method: Any, optional: bool = False) -> Any:
    """``method``'s signature with its type hints resolved; ``optional``: every parameter defaults to None, so
    that a missing argument reaches the tool, which names it in words."""
    import inspect
    import typing

    signature = inspect.signature(method)
    hints = typing.get_type_hints(method)

    def published(parameter: inspect.Parameter) -> inspect.Parameter:
        annotation = hints.get(parameter.name, parameter.annotation)
        if optional and parameter.default is inspect.Parameter.empty:
            return parameter.replace(annotation=annotation | None, default=None)
        return parameter.replace(annotation=annotation)

    return signature.replace(parameters=[published(p) for p in signature.parameters.values()],
                             return_annotation=hints.get("return", signature.return_annotation))


def serve(root: str | Path) -> int:
    """Run the server on stdio until the client closes it; 2 with one line where the SDK or the root is missing."""
    import sys

    try:
        server = build_server(root)
    except ImportError:
        print("perfhooks mcp needs the mcp SDK: pip install 'perfhooks[mcp]'", file=sys.stderr)
        return 2
    except PathRefused as error:
        print(f"perfhooks mcp: {error}", file=sys.stderr)
        return 2
    server.run("stdio")
    return 0
