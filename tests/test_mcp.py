"""Issue 42, part 3: ``perfhooks mcp`` driven end to end by the ``mcp`` SDK's own client over stdio, on a real
finished run, a trace and two runs to gate."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from test_gate import run as plain_run

from helpers import read_report

TOOLS = {"list_runs", "run_summary", "diagnoses", "live_status", "open_window", "analyze", "diff"}
TRACE = Path(__file__).parent / "data" / "traces" / "hta" / "a100_alexnet_sync.json.gz"


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def call_all(root: Path, calls: list[tuple[str, dict[str, Any]]]) -> tuple[set[str], list[Any]]:
    """The server's tool names, and each call's result, over one stdio session."""
    async def session() -> tuple[set[str], list[Any]]:
        server = StdioServerParameters(command=sys.executable, args=["-m", "perfhooks", "mcp", "--root", str(root)])
        async with Client(server) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            return names, [await client.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(session)


def structured(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    value = result.structured_content
    return value["result"] if set(value) == {"result"} else value


def test_an_agent_reads_runs_diagnoses_and_gates_over_stdio(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    base = plain_run(root / "base", 0.020)
    plain_run(root / "slower", 0.028)
    shutil.copy(TRACE, root / TRACE.name)
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("not a run")
    before = files_under(root)
    report = read_report(base)

    names, results = call_all(root, [
        ("list_runs", {"folder": "."}),
        ("diagnoses", {"run": "base"}),
        ("run_summary", {"run": "base"}),
        ("live_status", {"run": "base"}),
        ("diff", {"before": "base", "after": "slower", "gate_percent": 5}),
        ("analyze", {"trace": TRACE.name}),
        ("open_window", {"run": "slower"}),
        ("diagnoses", {"run": "../"}),
        ("diagnoses", {"run": "notes"}),
        ("diagnoses", {"run": "nowhere"}),
        ("analyze", {"trace": "notes/todo.txt"}),
        ("open_window", {"run": "notes"}),
    ])
    assert names == TOOLS
    listed, verdicts, summary, live, gated, analysed, opened = map(structured, results[:7])
    assert [(r["run"], r["status"], r["steps"]) for r in listed] == [("base", "completed", 60),
                                                                     ("slower", "completed", 60)]
    assert [d["id"] for d in verdicts] == [d["id"] for d in report["diagnoses"]]
    for got, want in zip(verdicts, report["diagnoses"], strict=True):
        assert (got["evidence"], got["recommendation"], got["estimated_gain"]) == \
            (want["evidence"], want["recommendation"], want["estimated_gain"])
    assert summary["steps"] == 60 and summary["step_ms"] == report["step_ms"] and summary["ledger"] == report["ledger"]
    assert live["source"] == "report" and live["status"] == "completed"  # it ended: not its last live frame
    assert gated["verdict"] == "regressed" and gated["gate"]["step_ms"]["change"] > 0.05
    assert analysed["device"]["type"] == "cuda" and analysed["diagnoses"]
    assert opened["trigger"] == "slower/TRIGGER" and "finished run will not see it" in opened["message"]

    errors = [result.content[0].text for result in results[7:]]
    assert all(result.is_error for result in results[7:])
    assert "run '../' is outside the folder this server reads" in errors[0]
    assert "run 'notes' is not a perfhooks output folder" in errors[1]
    assert "run 'nowhere': no such file or folder" in errors[2]
    assert "trace 'notes/todo.txt'" in errors[3]
    assert "run 'notes' is not a perfhooks output folder" in errors[4]
    # the one file written: the trigger, in the run's own folder
    after = files_under(root)
    assert set(after) - set(before) == {"slower/TRIGGER"} and all(after[k] == v for k, v in before.items())


def test_an_empty_root_and_a_missing_argument_are_said_in_words_and_the_version_given(tmp_path: Path) -> None:
    import perfhooks

    async def session() -> tuple[Any, Any]:
        server = StdioServerParameters(command=sys.executable, args=["-m", "perfhooks", "mcp", "--root", str(tmp_path)])
        async with Client(server) as client:
            return (client.server_info, await client.call_tool("list_runs", {"folder": "."}),
                    await client.call_tool("diff", {"before": "a"}))

    initialized, listed, short = anyio.run(session)
    assert initialized.version == perfhooks.__version__
    assert listed.is_error and "no perfhooks run under folder '.'" in listed.content[0].text
    assert short.is_error and "diff needs 'after' (required: before, after)" in short.content[0].text
    assert "pydantic" not in short.content[0].text


def test_without_a_root_folder_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfhooks.cli import main

    assert main(["mcp", "--root", str(tmp_path / "missing")]) == 2
    assert "perfhooks mcp: --root" in capsys.readouterr().err
