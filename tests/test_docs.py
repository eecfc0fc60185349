"""The README a newcomer reads first, and the documentation site beside it (issue 29, item 1)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_starts_with_both_commands_and_the_quickstart() -> None:
    lines = README.splitlines()
    assert len(lines) <= 200
    head = "\n".join(lines[:40])
    assert "examples/lightning_example.py" in head and ".venv/bin/pytest" in head
    assert "## Quickstart" in head and "report.html" in head


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in README.splitlines() if line.endswith(".venv/bin/pytest"))
    assert command in ci


def test_every_docs_link_in_the_readme_and_every_nav_page_exists() -> None:
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), target
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    assert nav and all((ROOT / "docs" / page).is_file() for page in nav)
    assert sorted(nav) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))  # no page left out of the nav


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="needs the docs extra (pip install -e '.[docs]')")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--quiet",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "max_traces" in api and "PerfCallback" in api and "data_wait" in api  # rendered from the docstrings


def test_the_analysis_page_counts_the_calibration_traces_there_are() -> None:
    """The page's count of calibration traces is the table's (it said 22 when there were 24)."""
    import json


    traces = json.loads((ROOT / "tests" / "data" / "calibration.json").read_text())["traces"]
    said = re.search(r"for each of the (\d+) shared traces", (ROOT / "docs" / "analysis.md").read_text())
    assert said is not None and int(said.group(1)) == len(traces)


def test_the_tested_framework_ranges_in_the_docs_are_the_codes() -> None:
    """Issue 67, item 6: the docs said the tested transformers range ends at 5.23 where the code said 5.24."""
    from perfhooks.integrations.versions import TESTED

    text = (ROOT / "docs" / "usage.md").read_text()
    for name, shown in (("lightning", "Lightning"), ("transformers", "transformers"), ("accelerate", "accelerate")):
        (low_major, low_minor), (high_major, high_minor) = TESTED[name]
        assert f"{shown} {low_major}.{low_minor}–{high_major}.{high_minor}" in text, name
        assert f"{shown} {high_major}.{high_minor}" in text, name


def test_tunes_help_names_its_own_output_folder(capsys: pytest.CaptureFixture[str]) -> None:
    """``tune --help`` named a run's default output folder where tune writes to perfhooks_tune (docs/tune.md)."""
    from perfhooks.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "(default: perfhooks_tune)" in shown
    assert "default `perfhooks_tune`" in " ".join((ROOT / "docs" / "tune.md").read_text().split())


def test_the_performance_page_is_a_short_reference_whose_figures_link_their_files() -> None:
    """Issue 68, item 4: docs/performance.md had 216 lines, some of 2,400 characters, and cited a folder outside the
    repository. Now: at most 100 lines of at most 400 characters, and every results file it names exists."""
    text = (ROOT / "docs" / "performance.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 100 and max(map(len, lines)) <= 400
    assert "shared/measurements" not in text
    named = set(re.findall(r"`((?:benchmarks/results/)?(?:[\w.-]+/)*[\w.-]+\.(?:json|txt|md))`", text))
    results = ROOT / "benchmarks" / "results"
    missing = [name for name in named - {"report.json"} if not (ROOT / name).exists() and not (results / name).exists()]
    assert named and missing == []
