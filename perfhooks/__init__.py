"""perfhooks: make a PyTorch training run explain its own performance."""

__version__ = "0.1.0"

from perfhooks.config import PerfConfig
from perfhooks.engine import Engine
from perfhooks.faults import PerfhooksWarning
from perfhooks.phases import PHASES
from perfhooks.schedule import Action, Schedule

__all__ = ["PHASES", "Action", "Engine", "PerfConfig", "PerfhooksWarning", "Schedule", "__version__"]
