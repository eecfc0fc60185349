"""The package builds and installs as documented, with the adapters under perfhooks.integrations."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_holds_core_and_integrations(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, timeout=600)
    wheel = next(tmp_path.glob("perfhooks-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {path.relative_to(REPO).as_posix() for path in (REPO / "perfhooks").rglob("*.py")}
    adapters = {f"perfhooks/{path.relative_to(REPO).as_posix()}" for path in (REPO / "integrations").glob("*.py")}
    missing = (sources | adapters) - names
    assert not missing, f"modules left out of the wheel (pyproject's package list): {sorted(missing)}"
    assert {"perfhooks/runtime/engine.py", "perfhooks/runtime/ending/lifecycle.py", "perfhooks/cli/main.py",
            "perfhooks/integrations/lightning.py"} <= names
    assert not any(name.startswith(("tests/", "examples/", "integrations/")) for name in names)


def test_integrations_import_path() -> None:
    import perfhooks.integrations.lightning as adapter

    assert adapter.PerfCallback.__module__ == "perfhooks.integrations.lightning"


def test_analyze_and_diff_run_where_torch_is_not_installed(tmp_path: Path) -> None:
    """A fresh virtual environment with perfhooks and its light dependencies but no torch: ``perfhooks analyze``
    and ``diff`` work, and ``import perfhooks.analysis`` imports no torch."""
    import importlib.util

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = tmp_path / "site"
    site.mkdir()
    (site / "perfhooks").symlink_to(REPO / "perfhooks")
    for name in ("numpy", "orjson", "msgspec"):
        location = Path(importlib.util.find_spec(name).origin).parent
        (site / name).symlink_to(location)
        libs = location.parent / f"{name}.libs"  # a manylinux wheel's bundled shared libraries
        if libs.is_dir():
            (site / libs.name).symlink_to(libs)
    python = venv / "bin" / "python"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    probe = subprocess.run([str(python), "-c", "import importlib.util, sys, perfhooks.analysis, perfhooks.rules; "
                            "print(importlib.util.find_spec('torch') is None, 'torch' in sys.modules)"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert probe.stdout.split() == ["True", "False"], probe.stderr
    traces = REPO / "tests" / "data" / "traces" / "tb_plugin"
    trace = traces / "resnet50_num_workers_0.worker0.1623143089861.pt.trace.json.gz"
    analyzed = subprocess.run([str(python), "-m", "perfhooks", "analyze", str(trace), "--format", "json"],
                              capture_output=True, text=True, env=env, timeout=300)
    assert analyzed.returncode == 0, analyzed.stderr
    assert "dataloader_bound" in {d["id"] for d in json.loads(analyzed.stdout)["diagnoses"]}
    other = traces / "resnet50_num_workers_4.worker0.1623212756351.pt.trace.json.gz"
    diffed = subprocess.run([str(python), "-m", "perfhooks", "diff", str(trace), str(other)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert diffed.returncode == 0, diffed.stderr
    assert "data_wait" in diffed.stdout or "dataloader" in diffed.stdout


@pytest.mark.parametrize(("integration", "framework", "name"), [
    ("lightning", "lightning", "PerfCallback"),
    ("transformers", "transformers", "PerfTrainerCallback"),
])
def test_an_integration_without_its_framework_names_the_extra_that_installs_it(integration: str, framework: str,
                                                                                name: str) -> None:
    """Issue 68, item 5: a bare ``No module named 'lightning'`` said nothing of perfhooks' extras. The framework is
    hidden from a fresh interpreter as if it were not installed (``sys.modules[name] = None``)."""
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.modules[{framework!r}] = None\n"
                           f"from perfhooks.integrations.{integration} import {name}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"ModuleNotFoundError: perfhooks.integrations.{integration} needs {framework}, which is not "
                    f'installed: pip install "perfhooks[{integration}]"'), done.stderr[-2000:]


def test_the_accelerate_hooks_import_without_accelerate_and_the_cli_says_its_version() -> None:
    """``attach`` takes the Accelerator a script built, so its module needs no accelerate of its own; and
    ``perfhooks --version`` answers as every CLI of this ecosystem does."""
    import perfhooks

    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['accelerate'] = None\n"
                           "from perfhooks.integrations.accelerate import attach"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    version = subprocess.run([sys.executable, "-m", "perfhooks", "--version"], capture_output=True, text=True,
                             timeout=120)
    assert (version.returncode, version.stdout.strip()) == (0, f"perfhooks {perfhooks.__version__}")


def test_a_folder_named_perfhooks_in_the_current_folder_is_named_with_its_fix(tmp_path: Path) -> None:
    """Issue 74: with an editable install, a ``perfhooks/`` folder (an older version's report folder) is imported as a
    namespace package in place of the package, and ``python -m perfhooks`` failed with "cannot import name
    '__version__' ... (unknown location)". A regular install is not hidden: it runs."""
    (tmp_path / "perfhooks").mkdir()
    (tmp_path / "perfhooks" / "report.json").write_text("{}")
    done = subprocess.run([sys.executable, "-m", "perfhooks", "--version"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode == 0:
        assert done.stdout.startswith("perfhooks ")
    else:
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1 and f"{tmp_path / 'perfhooks'} hides the installed package" in done.stderr


@pytest.mark.slow
def test_a_clone_named_perfhooks_beside_the_script_does_not_hide_the_install_the_readme_gives(tmp_path: Path) -> None:
    """Issue 85: a newcomer's ``git clone`` makes a folder named ``perfhooks``; a ``train.py`` beside it imported that
    folder as a namespace package under an editable install. Installed as the README's "Your own script" says (not
    editable), the script gets the package: its version and the Lightning integration."""
    clone = tmp_path / "perfhooks"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    readme = (REPO / "README.md").read_text()
    assert 'pip install "/path/to/perfhooks[' in readme  # what is installed below: the clone, not editable
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(clone)], check=True, timeout=600)
    (tmp_path / "train.py").write_text(
        "import perfhooks\nfrom perfhooks.integrations.lightning import PerfCallback\n"
        "print(perfhooks.__version__, perfhooks.__file__, PerfCallback.__module__)\n")
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    version, location, module = done.stdout.split()
    import perfhooks

    assert (version, module) == (perfhooks.__version__, "perfhooks.integrations.lightning")
    assert Path(location).is_relative_to(site)
