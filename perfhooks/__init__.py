"""perfhooks: make a PyTorch training run explain its own performance."""

__version__ = "0.1.0"

from perfhooks.config import PerfConfig  # noqa: E402
from perfhooks.engine import Engine  # noqa: E402
from perfhooks.faults import PerfhooksWarning  # noqa: E402
from perfhooks.phases import PHASES  # noqa: E402
from perfhooks.schedule import Action, Schedule  # noqa: E402

__all__ = ["PHASES", "Action", "Engine", "PerfConfig", "PerfhooksWarning", "Schedule", "__version__"]
