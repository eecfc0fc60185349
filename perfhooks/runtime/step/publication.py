"""When a step's end publishes the run's state, and what asks it to: the long path's cadence (a part of
:class:`~perfhooks.runtime.step.tracker.StepTracker`).

A detailed step's end publishes when it was forced, when the cadence is due, at the step the listener asked for
(its next W&B rows), or through the sampler's warm-up; a light step or a dark block publishes when it ends on the
long path and the cadence is due. The cadence follows the long path's own cost in place (:meth:`_long_path_took`).
Another thread (a signal's handler, the writer with a window's verdicts) may ask for the next step's end
(:meth:`Publication.wake`, :meth:`Publication.publish_soon`): attribute writes only. What a publication does is the
listener's (:meth:`perfhooks.runtime.step_listener.RunParts.step_closed`).
"""

from __future__ import annotations

from typing import Any

#: Light steps and the detailed steps the sampler drew publish the run's state at most this often (ns of their
#: clock; more seldom as the long path costs more, :attr:`StepTracker.publish_every_ns`), unless the listener asks for
#: a step (:attr:`StepTracker.publish_at_step`). The run's first steps (the sampler's warm-up), steps a window or a
#: count forced, and every step when every step is detailed (no budget) publish at their end.
LIGHT_PUBLISH_EVERY_NS = 20_000_000
#: The long path (what light steps fold, the published state, a step's opening) comes at most every
#: :data:`LIGHT_PUBLISH_EVERY_NS`, and further apart as it costs more, so that its cost in place stays within
#: :data:`LONG_PATH_SHARE` of the steps' clock; never more than :data:`PUBLISH_EVERY_MAX_NS` apart (a signal's report
#: or ``top`` may miss the last second of steps, not more).
PUBLISH_EVERY_MAX_NS = 1_000_000_000
#: The long path's share of the steps' clock, in place: half of 0.1%, since on the wall clock it costs more (its
#: Python slows the user's next steps; 1.5 to 3 times on the simulated launch-bound loop).
LONG_PATH_SHARE = 0.0005


class Publication:
    """The tracker's publication cadence (a mixin of :class:`~perfhooks.runtime.step.tracker.StepTracker`: the
    attributes are the tracker's, set in its ``_init_light_steps``)."""

    listener: Any
    fast: Any
    closed: bool
    quiet_until_step: int
    step: int
    publish_at_step: int
    publish_every_ns: int
    _publish_at: int
    _long_path_ns: float
    _short_left: int
    _short_until_ns: int

    def wake(self) -> None:
        """The next step opens on the long path, with the listener's ``step_opening`` (a signal's handler may call
        it: it only sets two attributes)."""
        self.quiet_until_step = 0
        self._short_left = 0
        self._short_until_ns = 0  # an open dark block ends at its next step's end
        self.fast.open = False

    def publish_soon(self) -> None:
        """The next step's end publishes the run's state (another thread may call it: two attribute writes)."""
        self._publish_at = 0
        self._short_left = 0
        self._short_until_ns = 0
        self.fast.open = False

    def stop(self) -> None:
        """No event is taken from now on (the run closes)."""
        self.closed = True
        self._short_left = 0
        self._short_until_ns = 0
        self.fast.open = False

    def _long_path_took(self, ns: int) -> None:
        """A light step or a dark block ended on the long path, which took ``ns`` in place: the next come far enough
        apart (:attr:`publish_every_ns`) that the long path's running mean cost stays within
        :data:`LONG_PATH_SHARE` of the steps' clock."""
        mean = self._long_path_ns = ns if not self._long_path_ns else 0.75 * self._long_path_ns + 0.25 * ns
        self.publish_every_ns = int(min(PUBLISH_EVERY_MAX_NS, max(LIGHT_PUBLISH_EVERY_NS, mean / LONG_PATH_SHARE)))

    def _publish_if_due(self, now_ns: int) -> None:
        """A light step's or a dark block's end publishes the run's state (W&B rows, saves) on its cadence, or from
        the step the listener asked for."""
        if now_ns >= self._publish_at or self.step >= self.publish_at_step:
            self._publish_at = now_ns + self.publish_every_ns
            self.listener.step_closed()
