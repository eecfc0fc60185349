"""The real traces in tests/data, each analysed once per test session."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = DATA / "traces"
RESNET = sorted(p.name for p in (TRACES / "tb_plugin").iterdir())
NUM_WORKERS_0 = [name for name in RESNET if "num_workers_0" in name]
NUM_WORKERS_4 = [name for name in RESNET if "num_workers_4" in name]


MORE = sorted(p.name for p in (TRACES / "more").iterdir())


def path(name: str) -> Path:
    folder = "tb_plugin" if name.startswith("resnet50") else "more" if name in MORE else "hta"
    return TRACES / folder / name


@cache
def report(name: str) -> dict[str, Any]:
    from perfhooks.offline.analyze import analyze_paths

    return analyze_paths([path(name)])


@cache
def tb_reference() -> dict[str, Any]:
    return json.loads((DATA / "tb_plugin_reference.json").read_text())
