"""The framework versions each integration was tested on, in one place: the integrations reach into framework
internals (private methods wrapped on instances, loop state, transformers' ``_get_num_items_in_batch``, the
profiler's ``_prev_schedule_action``), and each such reach is guarded by a ``getattr``/``hasattr`` check at its
use. A version outside these ranges is not refused: the run is profiled, and says once that it was not tested.
``perfhooks run`` reads the same table.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

#: distribution -> ((major, minor) oldest, (major, minor) newest) tested, inclusive.
TESTED: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "lightning": ((2, 2), (2, 6)),
    "transformers": ((4, 46), (5, 24)),
    "accelerate": ((1, 0), (1, 15)),
    "torch": ((2, 4), (2, 13)),
    "wandb": ((0, 18), (0, 31)),
    "nvtx": ((0, 2), (0, 2)),
}

#: The framework internals the integrations reach (each also guarded where it is used): (module, class,
#: attribute). ``perfhooks doctor`` lists which are present; a missing one means that piece is skipped.
PRIVATE_APIS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "lightning": (
        ("lightning.pytorch.callbacks", "ModelCheckpoint", "_save_checkpoint"),
        ("lightning.pytorch.loops.fit_loop", "_FitLoop", "_should_accumulate"),
        ("lightning.pytorch.profilers", "PassThroughProfiler", "start"),
    ),
    "transformers": (
        ("transformers", "Trainer", "get_batch_samples"),
        ("transformers", "Trainer", "_get_num_items_in_batch"),
        ("transformers", "Trainer", "_save_checkpoint"),
        ("transformers", "Trainer", "training_step"),
        ("transformers", "Trainer", "compute_loss"),
    ),
    "accelerate": (
        ("accelerate", "Accelerator", "backward"),
        ("accelerate", "Accelerator", "save_state"),
        ("accelerate", "Accelerator", "skip_first_batches"),
        ("accelerate.data_loader", "DataLoaderShard", "__iter__"),
    ),
    "torch": (
        ("torch.profiler", "profile", "step"),
        ("torch.cuda.memory", "", "_record_memory_history"),
        ("torch.cuda.memory", "", "_snapshot"),
    ),
}


def missing_private_apis(framework: str) -> list[str] | None:
    """The internals of ``framework`` that perfhooks uses and this version lacks (``module.Class.attribute``);
    None when the framework is not installed. Imports the framework."""
    import importlib

    missing = []
    for module_name, class_name, attribute in PRIVATE_APIS[framework]:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            return None if module_name.split(".")[0] == framework else [module_name]
        if class_name:
            owner = getattr(owner, class_name, None)
        if owner is None or not hasattr(owner, attribute):
            missing.append(".".join(part for part in (module_name, class_name, attribute) if part))
    return missing


def untested(distribution: str) -> str | None:
    """A one-line note when the installed ``distribution`` is outside its tested range, else None (in range, not
    installed, or a version with no major.minor)."""
    low, high = TESTED[distribution]
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    if len(parts) != 2 or low <= parts <= high:
        return None
    return (f"{distribution} {version} was not tested with perfhooks (tested {low[0]}.{low[1]} to "
            f"{high[0]}.{high[1]}); profiling it anyway: a changed internal is skipped with a warning")


def note_versions(engine: Any, framework: str) -> None:
    """Say once, through the run's engine, which of ``framework`` and torch are outside their tested ranges, and
    which internals perfhooks reaches they lack (what ``perfhooks doctor`` lists). Never raises."""
    once = getattr(engine, "once", None)
    if once is None:
        return
    for distribution in (framework, "torch"):
        try:
            note = untested(distribution)
            missing = missing_private_apis(distribution)
        except Exception:  # a check of perfhooks' own: never into the user's run
            continue
        if note is not None:
            once.warn(f"untested_{distribution}", note)
        if missing:
            once.warn(f"internals_{distribution}", f"{distribution} lacks {', '.join(missing)}, which perfhooks "
                      "uses; what needs them is skipped (perfhooks doctor lists them)")
