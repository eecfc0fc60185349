"""Thin adapters from training frameworks' hooks to :class:`perfhooks.Engine` events.

Import the one you use; each imports its framework lazily, the core never does:

- ``perfhooks.integrations.lightning.PerfCallback``
- ``perfhooks.integrations.transformers.PerfTrainerCallback``
- ``perfhooks.integrations.accelerate.attach``

Each also has ``instrument_constructions(module, launcher)``, which ``perfhooks run`` calls when the
script imports that framework.
"""
