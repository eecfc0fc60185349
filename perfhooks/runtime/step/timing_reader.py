"""The timing reader: one thread per run on a device that reads the step timings off the training thread.

A step's phases are timed by events recorded on the device's stream. Reading them back is most of the device
calls a step costs: a query to know they completed, then one ``elapsed_time`` per mark, and torch's
``elapsed_time`` queries both events again before it reads them. On the training thread of a host-bound step
each call is time taken from the step, so they are made here, every :data:`READ_EVERY_S`, by
:meth:`PendingSteps.resolve <perfhooks.runtime.step.steps.PendingSteps.resolve>`; the training thread only collects
the resolved timings at each step's end. Nothing is asked while a CUDA graph capture may be under way.

It wakes :data:`READ_EVERY_S` apart and reads the steps since the last wake. On CUDA each interval is one
``cudaEventElapsedTime`` that releases the GIL (:meth:`DeviceClock.bind_reader
<perfhooks.device.clock.DeviceClock.bind_reader>`), where torch's ``elapsed_time`` holds it for three runtime calls.
Its share of each second is measured by ``benchmarks/sim_step_cost.py`` on the simulation and
``benchmarks/gpu_check.py`` on a GPU (the figures: ``docs/performance.md``).
"""

from __future__ import annotations

import threading

from perfhooks.faults import FaultLog
from perfhooks.runtime.step.steps import PendingSteps

#: Seconds between two reads of the pending steps: waking more often cost a launch-bound loop more, and its reader
#: more CPU, for figures no one reads sooner.
READ_EVERY_S = 0.2


class TimingReader:
    """Resolves a run's pending device steps on a daemon thread of its own."""

    def __init__(self, pending: PendingSteps, faults: FaultLog, every_s: float | None = None) -> None:
        self.pending = pending
        self.faults = faults
        self.every_s = READ_EVERY_S if every_s is None else every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.pending.background = True
        self._thread = threading.Thread(target=self._run, name="perfhooks-timings", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop reading (idempotent); from here on the close resolves what is left on its own thread."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        self.pending.background = False

    def _run(self) -> None:
        try:
            self.pending.clock.bind_reader()  # CUDA: intervals read without holding the GIL
        except Exception as error:
            self.faults.report("timing_reader", error)
        while not self._stop.wait(self.every_s):
            try:
                self.pending.resolve()
            except Exception as error:
                self.faults.report("timing_reader", error)
