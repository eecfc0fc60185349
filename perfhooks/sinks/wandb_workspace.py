"""A saved W&B workspace view for perfhooks' keys, built with ``wandb-workspaces`` (an optional extra).

    perfhooks wandb-workspace ENTITY/PROJECT [--name "perfhooks"] [--dry-run]

The view is data (:data:`SECTIONS`): diagnoses, phases, step time and coverage, memory, the run account,
the GPU figures of the windows, and the HTML report. Every key it names is one perfhooks logs
(``tests/sinks/test_wandb_workspace.py`` checks them against a real offline run's records). The x axis
is ``perf/step``, which every perf row carries whatever the framework's own step key.
``wandb_workspaces`` is imported only when the view is built.
"""

from __future__ import annotations

from typing import Any

from perfhooks.events import PHASES
from perfhooks.sinks.wandb import PERF_STEP, WINDOW_FIGURES

_PHASES = (*PHASES, "other")

#: The view: sections of panels. Panel kinds: ``table`` (a logged wandb.Table), ``lines`` (``y`` keys or a
#: ``regex``; ``stacked`` areas), ``bars`` (summary keys), ``media`` (a logged wandb.Html).
SECTIONS: list[dict[str, Any]] = [
    {"name": "perf: diagnoses", "panels": [
        {"kind": "table", "title": "Diagnoses (ranked by estimated gain)", "key": "perf/diagnoses"}]},
    {"name": "perf: where step time goes", "panels": [
        {"kind": "lines", "title": "Phase shares of step time", "stacked": True,
         "y": [f"perf/phase/{phase}_share" for phase in _PHASES]},
        {"kind": "lines", "title": "Phase ms per step", "y": [f"perf/phase/{phase}_ms" for phase in _PHASES]}]},
    {"name": "perf: step time", "panels": [
        {"kind": "lines", "title": "Step time (ms)", "y": ["perf/step_ms", "perf/step_max_ms"]},
        {"kind": "lines", "title": "Steps per second", "y": ["perf/steps_per_s"]},
        {"kind": "lines", "title": "Coverage (share of the step in the four phases)", "y": ["perf/coverage"]}]},
    {"name": "perf: throughput and MFU", "panels": [
        {"kind": "lines", "title": "Samples and tokens per second", "regex": r"perf/(samples|tokens)_per_s"},
        {"kind": "lines", "title": "MFU (0..1)", "y": ["perf/mfu"]},
        {"kind": "lines", "title": "Achieved FLOP/s", "y": ["perf/achieved_flops_per_s"]}]},
    {"name": "perf: memory", "panels": [
        {"kind": "lines", "title": "Memory (bytes)", "regex": r"perf/mem/.*_bytes"}]},
    {"name": "perf: run account and figures", "panels": [
        {"kind": "table", "title": "The run's figures (the run account in s, headline figures, top diagnoses)",
         "key": "perf/figures"}]},
    {"name": "perf: GPU (capture windows)", "panels": [
        {"kind": "lines", "title": "GPU utilization, SM efficiency, occupancy",
         "y": [f"perf/{name}" for name in WINDOW_FIGURES]}]},
    {"name": "perf: report", "panels": [{"kind": "media", "title": "report.html", "keys": ["perf/report"]}]},
]


def referenced_keys() -> tuple[set[str], set[str]]:
    """(keys, regexes) the view names."""
    keys, regexes = set(), set()
    for section in SECTIONS:
        for panel in section["panels"]:
            keys.update(panel.get("y", []), panel.get("metrics", []), panel.get("keys", []))
            if "key" in panel:
                keys.add(panel["key"])
            if "regex" in panel:
                regexes.add(panel["regex"])
    return keys, regexes


def build_workspace(entity: str, project: str, name: str = "perfhooks") -> Any:
    """The ``wandb_workspaces.workspaces.Workspace`` of :data:`SECTIONS` (not saved)."""
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as error:
        raise RuntimeError("the workspace view needs wandb-workspaces: pip install 'perfhooks[workspace]'") from error

    def panel(spec: dict[str, Any]) -> Any:
        kind = spec["kind"]
        if kind == "table":
            return wr.WeavePanelSummaryTable(table_name=spec["key"])
        if kind == "media":
            return wr.MediaBrowser(title=spec["title"], media_keys=list(spec["keys"]))
        if kind == "bars":
            return wr.BarPlot(title=spec["title"], metrics=list(spec["metrics"]))
        if "regex" in spec:
            return wr.LinePlot(title=spec["title"], x=PERF_STEP, metric_regex=spec["regex"])
        return wr.LinePlot(title=spec["title"], x=PERF_STEP, y=list(spec["y"]),
                           plot_type="stacked-area" if spec.get("stacked") else "line")

    sections = [ws.Section(name=section["name"], is_open=index < 3, panels=[panel(p) for p in section["panels"]])
                for index, section in enumerate(SECTIONS)]
    return ws.Workspace(entity=entity, project=project, name=name, sections=sections)


def workspace_json(workspace: Any) -> dict[str, Any]:
    """What saving would send: the view's model, as JSON-ready data (no server needed)."""
    return workspace._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")
