"""The package builds and installs as documented, with the adapters under perfhooks.integrations."""

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
    assert {"perfhooks/engine.py", "perfhooks/sinks/console.py", "perfhooks/analysis/analyze.py",
            "perfhooks/integrations/lightning.py", "perfhooks/integrations/transformers.py",
            "perfhooks/integrations/accelerate.py", "perfhooks/cli.py"} <= names
    assert not any(name.startswith(("tests/", "examples/", "integrations/")) for name in names)


def test_integrations_import_path() -> None:
    import perfhooks.integrations.lightning as adapter

    assert adapter.PerfCallback.__module__ == "perfhooks.integrations.lightning"
