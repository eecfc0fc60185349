"""What a step holds besides its phases: its micro-batches' samples and tokens (counted on detailed steps by the
:class:`~perfhooks.runtime.step.batches.BatchCounter`) and the host work the framework named in it (a part of
:class:`~perfhooks.runtime.step.tracker.StepTracker`)."""

from __future__ import annotations

from typing import Any

from perfhooks.events import DATA_WAIT

#: Names kept in :attr:`StepTracker.named_work` (a framework names a fixed set of hooks; this bounds a
#: pathological one).
MAX_NAMED_WORK = 256


class StepContents:
    """The batches and named work of the open step (a mixin of :class:`~perfhooks.runtime.step.tracker.StepTracker`)."""

    record: Any
    phase: Any
    closed: bool
    faults: Any
    batches: Any
    account: Any
    stats: Any
    named_work: dict[str, float]
    unnamed_steps: int

    def host_batch(self, batch: Any) -> None:
        """The DataLoader handed over a batch on the host (this thread, inside a training fetch): its mask is kept
        for the batch the framework will give :meth:`batch` on the device, whose mask could not be read there."""
        if self.closed or self.phase is None or self.phase[0] != DATA_WAIT:
            return
        try:
            self.batches.host_batch(batch)
        except Exception as error:
            self.faults.report("host_batch", error)

    def batch(self, batch: Any) -> None:
        """A micro-batch of the open step is in hand: its samples and tokens count (shapes only, no device sync)."""
        record = self.record
        if record is None or self.closed:
            return
        try:
            self.batches.count(record, batch)
        except Exception as error:
            self.faults.report("batch", error)

    def named(self, name: str, ms: float) -> None:
        """Host work the framework named took ``ms`` while a training step was open (not in an aside). A Lightning
        step names about 24 callback hooks: one frame each, the aside check an attribute, not a property."""
        try:
            if self.record is None or self.account.open_asides:
                return
            work = self.named_work
            known = work.get(name)
            if known is not None:
                work[name] = known + ms
            elif len(work) < MAX_NAMED_WORK:
                work[name] = ms
        except Exception as error:
            self.faults.report("named", error)

    def named_work_per_step(self) -> dict[str, float]:
        """The largest named work, ms per step over the steps whose hooks were timed (the 10 largest)."""
        steps = max(self.stats.steps - self.unnamed_steps, 1)
        ranked = sorted(self.named_work.items(), key=lambda item: -item[1])[:10]
        return {name: round(ms / steps, 4) for name, ms in ranked}
