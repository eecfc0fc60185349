"""``dataloader_bound``'s fix fits the machine (issue 67, item 4): no more loader workers than the CPUs the process
may use, less the training process's own; too few, and the fix is to do the per-sample work once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfhooks.rules.live import loader_fix


def test_the_worker_count_stays_under_the_usable_cpus_and_hf_gets_its_field() -> None:
    assert "num_workers=4," in loader_fix("lightning", True, 32) and "pin_memory=True" in loader_fix(None, True, 32)
    assert "num_workers=2," in loader_fix("pytorch", False, 3) and "pin_memory" not in loader_fix("pytorch", False, 3)
    hf = loader_fix("transformers", True, 8)
    assert hf.startswith("TrainingArguments(dataloader_num_workers=4, dataloader_pin_memory=True,") and "DataLoader(" \
        not in hf
    for cpus in (1, 2):  # one worker, or none, beside training: the per-sample work once, before training
        fix = loader_fix("transformers", False, cpus)
        assert "num_workers" not in fix and f"may use {cpus} CPU(s)" in fix and "map(" in fix
    assert "num_workers=4," in loader_fix(None, False, None)  # unknown (an offline trace): the usual advice


SLOW_LOADER = textwrap.dedent("""
    import os, sys, time
    import torch
    import perfhooks

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # as a job scheduler would pin it: one CPU
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with perfhooks.profile(model, optimizer, output_dir=sys.argv[1], console=False, wandb=False,
                           schedule=None) as perf:
        for _ in range(20):
            with perf.data_wait():
                time.sleep(0.01)  # the loader's per-sample work, on the training process
                x = torch.randn(4, 8)
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
""")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_a_run_pinned_to_one_cpu_is_not_told_to_start_workers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SLOW_LOADER)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["device"]["usable_cpus"] == 1
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "dataloader_bound"]
    assert "num_workers" not in verdict["recommendation"] and "may use 1 CPU(s)" in verdict["recommendation"]


FIVE = 'TrainingArguments(train_sampling_strategy="group_by_length")'


@pytest.mark.parametrize(("version", "spelling"),
                         [("4.57.1", "TrainingArguments(group_by_length=True)"), ("5.24.0", FIVE), (None, FIVE)])
def test_length_grouping_is_spelled_for_the_installed_transformers(version: str | None, spelling: str) -> None:
    """transformers 5.x raises TypeError on group_by_length=True; 4.x has no train_sampling_strategy."""
    from perfhooks.rules.live import _length_fix, group_by_length

    assert group_by_length(version) == spelling
    assert spelling in _length_fix("transformers", version)
    fixed = _length_fix("transformers", version, fixed_width=True)  # samples padded before batching: pad per batch
    assert fixed.index("DataCollatorWithPadding") < fixed.index(spelling)


@pytest.mark.parametrize("spelling", [FIVE, "TrainingArguments(group_by_length=True)"])
def test_a_length_fix_does_not_ask_again_for_grouping_that_is_on(spelling: str) -> None:
    """Issue 67, item 3: step_time_variance repeated group_by_length=True where grouping was already on."""
    from perfhooks.rules.live import _length_fix

    said = _length_fix("transformers", "5.24.0", grouped=spelling)
    assert said.startswith(f"Samples are already grouped by length ({spelling})")
    assert "train_sampling_strategy=" not in said.replace(spelling, "") and "group_by_length=True" not in \
        said.replace(spelling, "")
    assert "SFTConfig(packing=True)" in said and "pad_to_multiple_of=64" in said
    fixed = _length_fix("transformers", "5.24.0", fixed_width=True, grouped=spelling)
    assert "DataCollatorWithPadding" in fixed and fixed.count("group_by_length") == spelling.count("group_by_length")


def test_the_hf_integration_reads_length_grouping_in_either_spelling() -> None:
    from types import SimpleNamespace

    from transformers import TrainingArguments

    from perfhooks.integrations.recipe import length_grouping

    assert length_grouping(SimpleNamespace(train_sampling_strategy="group_by_length")) == FIVE
    assert length_grouping(SimpleNamespace(group_by_length=True)) == "TrainingArguments(group_by_length=True)"
    assert length_grouping(SimpleNamespace(train_sampling_strategy="random", group_by_length=False)) is None
    args = TrainingArguments(output_dir="unused", use_cpu=True, train_sampling_strategy="group_by_length",
                             report_to="none")
    assert length_grouping(args) == FIVE
