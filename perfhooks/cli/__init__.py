"""The ``perfhooks`` command: ``analyze``, ``report``, ``diff``, ``wandb-workspace`` and ``run`` (the launcher)."""

from perfhooks.cli.main import main

__all__ = ["main"]
