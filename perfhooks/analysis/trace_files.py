"""Which files are traces: named directly, or found in folders (perfhooks' own output less its reports, memory
captures and merged traces), each rank's latest window kept."""

from __future__ import annotations

import re
from pathlib import Path

from perfhooks.analysis.trace import TraceError

TRACE_SUFFIXES = (".json", ".json.gz")


def find_traces(paths: list[str | Path], step: int | None = None) -> list[str]:
    """Trace files named directly or found (recursively) in folders, in a stable order: of perfhooks' own, each
    rank's latest window, or the window that starts at ``step``."""
    found: list[str] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(str(p) for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                            and not _is_perfhooks_output(p.relative_to(path)))
        elif path.exists():
            found.append(str(path))
        else:
            raise TraceError(f"{path}: no such file or folder")
    if step is not None:
        found = [name for name in found if (m := _PERFHOOKS_TRACE.match(Path(name).name)) is None
                 or int(m.group(2)) == step]
    if not found:
        at = f" of the window at step {step}" if step is not None else ""
        raise TraceError(f"{', '.join(map(str, paths))}: no trace files{at} (*.json, *.json.gz) found")
    return latest_window_per_rank(found)


_REPORT = re.compile(r"^report(\.rank\d+)?\.json$")


def _is_perfhooks_output(relative: Path) -> bool:
    """perfhooks' own JSON beside its traces in an output folder: reports, memory captures, OOM dumps, and the
    merged trace of the ranks' (whose ranks the folder's own traces already hold)."""
    return bool(_REPORT.match(relative.name)) or relative.parts[0] in ("memory", "oom", "merged")


_PERFHOOKS_TRACE = re.compile(r"^rank(\d+)\.step(\d+)\.pt\.trace\.json(\.gz)?$")


def latest_window_per_rank(files: list[str]) -> list[str]:
    """Of perfhooks' own traces (``rank{R}.step{N}...``), keep each rank's latest window; others stay."""
    latest: dict[tuple[str, int], tuple[int, str]] = {}
    kept: list[str] = []
    for name in files:
        match = _PERFHOOKS_TRACE.match(Path(name).name)
        if match is None:
            kept.append(name)
            continue
        key = (str(Path(name).parent), int(match.group(1)))
        step = int(match.group(2))
        if key not in latest or step > latest[key][0]:
            latest[key] = (step, name)
    return sorted(kept + [name for _, name in latest.values()])
