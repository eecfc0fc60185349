"""The tested framework versions: one table for the integrations and ``perfhooks run``."""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

import pytest

from perfhooks import Engine, PerfConfig, PerfhooksWarning
from perfhooks.integrations import versions


def test_the_installed_frameworks_are_the_tested_ones() -> None:
    """CI installs what the table says was tested: a new release there must be tried, then added."""
    assert {name: versions.untested(name) for name in versions.TESTED} == dict.fromkeys(versions.TESTED)


def test_an_untested_version_is_profiled_and_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "9.1.0" if name == "lightning" else real(name))
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "lightning")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.note_versions(engine, "lightning")
        versions.note_versions(engine, "lightning")
    said = [str(w.message) for w in caught if issubclass(w.category, PerfhooksWarning)]
    assert said == ["perfhooks: lightning 9.1.0 was not tested with perfhooks (tested 2.2 to 2.6); profiling it "
                    "anyway: a changed internal is skipped with a warning"]
    engine.close()


def test_a_missing_internal_is_said_once_at_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    monkeypatch.delattr(transformers.Trainer, "_get_num_items_in_batch")
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), tmp_path, "transformers")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.note_versions(engine, "transformers")
        versions.note_versions(engine, "transformers")
    said = [str(w.message) for w in caught if issubclass(w.category, PerfhooksWarning)]
    assert said == ["perfhooks: transformers lacks transformers.Trainer._get_num_items_in_batch, which perfhooks "
                    "uses; what needs them is skipped (perfhooks doctor lists them)"]
    engine.close()
