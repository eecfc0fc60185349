"""Reading an offline W&B run back through wandb's own reader (``wandb leet inspect --json``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def wandb_records(root: Path) -> list[dict[str, Any]]:
    """The records of the one offline run under ``root``, as wandb's own reader prints them."""
    logs = sorted(root.rglob("*.wandb"))
    assert len(logs) == 1, f"expected one run log under {root}, found {logs}"
    wandb_cli = Path(sys.executable).with_name("wandb")
    done = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(logs[0])], capture_output=True,
                          text=True, timeout=120, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def history(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["history"]["item"] for r in records if r["type"] == "history"]


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for record in records:
        if record["type"] == "summary":
            merged.update(record["summary"].get("update", {}))
    return merged


def metric_definitions(records: list[dict[str, Any]]) -> dict[str, str]:
    """Glob or name -> its step metric, from the run's ``define_metric`` records."""
    out = {}
    for record in records:
        if record["type"] == "metric":
            metric = record["metric"]
            out[metric.get("glob_name") or metric.get("name")] = metric.get("step_metric", "")
    return out


def artifacts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["artifact"] for r in records if r["type"] == "artifact"]
