"""Synthetic traces of a chosen size, tiled from a real one: the same event mix, shifted in time.

    python benchmarks/synthetic.py 1000000 out.json
    python benchmarks/synthetic.py 233000 mi300_62mb.json tests/data/traces/more/tl_mi300_resnet_act_ckpt.json.gz
        # the largest-AMD-trace row: a ROCm MI300X training trace tiled to 62 MB of JSON

Copy k of the source's events is shifted by k trace spans, and its correlation, external and flow
ids by k times the largest id, so kernels, runtime calls, flows and operators still pair up.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: A real trace (ResNet-50 on a V100, the TensorBoard plugin's sample): 109k events.
SOURCE = (REPO / "tests" / "data" / "traces" / "tb_plugin"
          / "resnet50_num_workers_0.worker0.1623143089861.pt.trace.json.gz")
_ID_KEYS = ("correlation", "External id", "external id")


def _shifted(event: dict[str, Any], dt: int, did: int) -> dict[str, Any]:
    event = dict(event)
    if "ts" in event and event.get("ph") != "M":
        event["ts"] = event["ts"] + dt
    if event.get("ph") in ("s", "f") and isinstance(event.get("id"), int):
        event["id"] += did
    args = event.get("args")
    if isinstance(args, dict) and any(key in args for key in _ID_KEYS):
        args = dict(args)
        for key in _ID_KEYS:
            if isinstance(args.get(key), int):
                args[key] += did
        event["args"] = args
    return event


def write_synthetic(events_wanted: int, target: Path, source: Path = SOURCE) -> int:
    """Write a trace of about ``events_wanted`` events to ``target`` (uncompressed JSON); the count written."""
    document = json.loads(gzip.decompress(source.read_bytes()))
    events = document["traceEvents"]
    timed = [e for e in events if "ts" in e and e.get("ph") != "M"]
    start = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - start + 1000
    top_id = max([e["id"] for e in events if isinstance(e.get("id"), int)]
                 + [e["args"][k] for e in events if isinstance(e.get("args"), dict) for k in _ID_KEYS
                    if isinstance(e["args"].get(k), int)]) + 1
    metadata = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    written = len(metadata)
    with open(target, "w") as out:
        header = {k: v for k, v in document.items() if k != "traceEvents"}
        out.write(json.dumps(header)[:-1] + ', "traceEvents": [')
        out.write(",".join(json.dumps(e) for e in metadata))
        copy = 0
        while written < events_wanted:
            take = body[: events_wanted - written]
            out.write("," + ",".join(json.dumps(_shifted(e, copy * span, copy * top_id)) for e in take))
            written += len(take)
            copy += 1
        out.write("]}")
    return written


if __name__ == "__main__":
    count = write_synthetic(int(sys.argv[1]), Path(sys.argv[2]), *(Path(a) for a in sys.argv[3:4]))
    print(f"{count} events -> {sys.argv[2]}")
