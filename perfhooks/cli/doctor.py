"""``perfhooks doctor``: check this machine, its device and its frameworks before a run relies on them.

    perfhooks doctor [--device cuda:N] [--format text|json] [-o FILE]

Prints a table of checks (``pass``, ``warn``, ``fail`` or ``skip``, each with its reason and measured figure),
or with ``--format json`` the whole table and the machine's description, for a bug report. Exit status 0, or 1
when a check failed. Changes nothing; runs in seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from perfhooks.cli.doctor_checks import FAIL, machine, run_checks
from perfhooks.cli.machine import out

STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def doctor(device: str | None = None) -> dict[str, Any]:
    """The doctor's document: ``{"machine", "checks": [{name, status, detail, figure}], "summary"}``."""
    checks = [check.as_dict() for check in run_checks(device)]
    summary = {status: sum(check["status"] == status for check in checks) for status in STYLES}
    return {"perfhooks_doctor": 1, "machine": machine(), "checks": checks, "summary": summary}


def render(document: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="perfhooks doctor", show_lines=False)
    for column in ("check", "status", "detail"):
        table.add_column(column, overflow="fold")
    for check in document["checks"]:
        table.add_row(check["name"], f"[{STYLES[check['status']]}]{check['status']}[/]", check["detail"])
    console = Console()
    console.print(table)
    summary = document["summary"]
    console.print(", ".join(f"{count} {status}" for status, count in summary.items()))


def run(device: str | None, output_format: str, output: str | None) -> int:
    try:
        document = doctor(device)
    except Exception as error:  # a check that could not run at all: one line
        print(f"perfhooks doctor: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if output is not None:
        Path(output).write_text(json.dumps(document, indent=2) + "\n")
    if output_format == "json":
        print(json.dumps(document, indent=2), file=out())
    else:
        render(document)
    return 1 if document["summary"][FAIL] else 0
