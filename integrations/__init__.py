"""Thin adapters from training frameworks' hooks to :class:`perfhooks.Engine` events.

Import the one you use; each imports its framework lazily, the core never does:

- ``perfhooks.integrations.lightning.PerfCallback``
"""
