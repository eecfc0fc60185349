"""The names every integration maps its framework's hooks onto.

One optimizer step of a training loop, as the engine sees it::

    step_start                      # the loop starts waiting for the step's first batch
      phase data_wait               # host time until the batch is in hand (incl. H2D copy)
      phase forward                 # model forward and loss
      phase backward                # loss.backward()
      ...                           # gradient accumulation repeats data_wait/forward/backward
      phase optimizer               # optimizer.step()
    step_end                        # whatever no phase covered is reported as ``other``

``idle`` marks time that belongs to no step (evaluation, checkpointing, epoch ends);
``exception`` reports the user's error on its way out.
"""

from __future__ import annotations

DATA_WAIT = "data_wait"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
OTHER = "other"

#: The measured phases, in loop order.
PHASES: tuple[str, ...] = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER)

#: Phases whose time is read on the host clock even when CUDA events time the rest.
HOST_TIMED_PHASES: frozenset[str] = frozenset({DATA_WAIT})

#: ARGB colours of the NVTX ranges, one per phase (Nsight Systems shows them).
PHASE_COLORS: dict[str, int] = {
    DATA_WAIT: 0xFFE8A317,  # amber
    FORWARD: 0xFF2E86DE,  # blue
    BACKWARD: 0xFF8E44AD,  # purple
    OPTIMIZER: 0xFF27AE60,  # green
}
