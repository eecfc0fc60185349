"""Thin adapters from training frameworks' hooks to :class:`perfhooks.Engine` events.

Import the one you use; each imports its framework lazily, the core never does:

- ``perfhooks.integrations.lightning.PerfCallback``
- ``perfhooks.integrations.transformers.PerfTrainerCallback``
- ``perfhooks.integrations.accelerate.attach``

Each also has ``instrument_constructions(module, launcher)``, which ``perfhooks run`` calls when the
script imports that framework. Without its framework installed, importing one says which extra installs it.
"""

from __future__ import annotations


def missing_framework(integration: str, module: str, extra: str) -> ModuleNotFoundError:
    """The error an integration raises when its framework is not installed: which one, and the extra that installs
    it (raised ``from`` the original, so the import chain stays in the traceback)."""
    return ModuleNotFoundError(f"perfhooks.integrations.{integration} needs {module}, which is not installed: "
                               f'pip install "perfhooks[{extra}]"', name=module)
