"""The house: a small engine, short functions, and layers with no import running back up (docs/layout.md)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The longest a function may be (lines, decorators excluded), and the engine façade (lines).
MAX_FUNCTION_LINES = 80
MAX_ENGINE_LINES = 450


def _sources() -> list[Path]:
    return sorted([*(ROOT / "perfhooks").rglob("*.py"), *(ROOT / "integrations").rglob("*.py")])


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function (``TYPE_CHECKING`` blocks excluded)."""
    tree = ast.parse(path.read_text())
    type_checking = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                     and getattr(block.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(block)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_engine_is_a_small_facade() -> None:
    lines = len((ROOT / "perfhooks" / "runtime" / "engine.py").read_text().splitlines())
    assert lines <= MAX_ENGINE_LINES, f"runtime/engine.py has {lines} lines"


def test_no_folder_holds_more_than_15_modules() -> None:
    """Issue 68: ``runtime/`` had 29 flat files; each room a newcomer can name holds a few."""
    crowded = {str(folder.relative_to(ROOT)): count for folder in [ROOT / "perfhooks", *(ROOT / "perfhooks").rglob("*")]
               if folder.is_dir() and folder.name != "__pycache__"
               and (count := len([path for path in folder.glob("*.py") if path.name != "__init__.py"])) > 15}
    assert crowded == {}


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []


def test_report_imports_neither_sinks_nor_analysis() -> None:
    upward = {f"{path.name}: {name}" for path in (ROOT / "perfhooks" / "report").glob("*.py")
              for name in _imports(path) if name.startswith(("perfhooks.sinks", "perfhooks.analysis"))}
    assert upward == set()


def test_the_lifecycle_and_the_exit_guard_import_no_engine() -> None:
    for name in ("lifecycle.py", "exit_guard.py"):
        imported = _imports(ROOT / "perfhooks" / "runtime" / "ending" / name)
        assert not {m for m in imported if m.startswith("perfhooks.runtime.engine")}, name
    guard = {m for m in _imports(ROOT / "perfhooks" / "runtime" / "ending" / "exit_guard.py")
             if m.startswith("perfhooks")}
    assert guard <= {"perfhooks.runtime.ending.signals", "perfhooks.runtime.ending.signals.SignalChain",
                     "perfhooks.runtime.ending.signals.SignalHelper", "perfhooks.locks",
                     "perfhooks.locks.interrupted_inside"}, guard


def test_nothing_outside_the_engine_reads_its_private_state() -> None:
    reached = []
    for path in _sources():
        if path.name == "engine.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in ("engine", "run")):
                reached.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert reached == []


@pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
                    reason="import-linter is a dev dependency")
def test_import_linter_keeps_the_layers_and_finds_no_circle() -> None:
    """The contracts in pyproject.toml: the layers (nothing imports upward), no circle among packages or among the
    modules of one package, no torch on the offline side, no framework in the core."""
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "The layers" in done.stdout and "No import circle" in done.stdout


def test_no_benchmark_script_imports_another_but_the_suite_which_runs_them_all() -> None:
    """``benchmarks/``: what the scripts share is in ``common.py``; a script imports no other script, and
    ``suite.py`` (the runner) imports every script but the GPU's own check, so that it runs every section."""
    folder = ROOT / "benchmarks"
    scripts = {path.stem for path in folder.glob("*.py")}
    imported = {path.stem: _imports(path) & scripts for path in folder.glob("*.py")}
    assert {name: found - {"common"} for name, found in imported.items() if name != "suite" and found - {"common"}} \
        == {}
    assert imported["suite"] == scripts - {"suite", "gpu_check"}
    assert not list((folder / "results").rglob("*.py"))
