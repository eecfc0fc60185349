"""Verdicts: each rule reads measurements and says what fired, by how much, what fixing it could gain, and how.

One module per question: :mod:`~perfhooks.rules.thresholds` (when rules fire), :mod:`~perfhooks.rules.verdicts`
(the diagnosis shape, ranking, docs links), :mod:`~perfhooks.rules.trace` (a profiler window's metrics),
:mod:`~perfhooks.rules.live` (phase timings while training), :mod:`~perfhooks.rules.run` (evaluation and
checkpoint time) and :mod:`~perfhooks.rules.ranks` (several ranks). Rules import no torch and nothing of the
runtime, so ``perfhooks analyze`` runs where torch is not installed.
"""

from perfhooks.rules.live import diagnose_live
from perfhooks.rules.ranks import diagnose_stragglers
from perfhooks.rules.run import diagnose_run
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.trace import diagnose_trace
from perfhooks.rules.verdicts import make, rank

__all__ = ["Thresholds", "diagnose_live", "diagnose_run", "diagnose_stragglers", "diagnose_trace", "make", "rank"]
