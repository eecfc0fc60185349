"""The names every integration maps its framework's hooks onto.

One optimizer step of a training loop, as the engine sees it::

    fetch                           # the loop asks its loader for the step's first batch
      phase data_wait               # until the batch is in hand (incl. H2D copy); on a GPU the exposed
                                    # part: the time the device sat idle for want of input
      phase forward                 # model forward and loss
      phase backward                # loss.backward()
      ...                           # gradient accumulation repeats fetch/forward/backward
      phase optimizer               # optimizer.step()
      stepped                       # the framework counted an optimizer step
      ...                           # callbacks, logging, LR schedulers: the step's ``other``
    fetch                           # the next batch: the step ends here

``aside("evaluation")`` and ``aside("checkpoint")`` bracket work that is not training: it is
timed in the run account and taken out of any step it interrupts. ``idle`` ends a step that
stepped (epoch ends); ``exception`` reports the user's error on its way out.
"""

from __future__ import annotations

DATA_WAIT = "data_wait"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
OTHER = "other"

EVALUATION = "evaluation"
CHECKPOINT = "checkpoint"
#: torch.compile compiling (dynamo's compile callbacks): taken out of the phase it fell in.
COMPILING = "compiling"

#: Work inside a training run that is not a training step: timed apart (the run account), taken out of any
#: step it interrupts, and labelled in traces so that no ``ProfilerStep`` contains it.
ASIDES: frozenset[str] = frozenset({EVALUATION, CHECKPOINT, COMPILING})

#: Named host work (``named``) that waits for the other ranks: its length is set by the slowest rank, not by
#: this one. transformers' ``Trainer._get_num_items_in_batch`` gathers each step's token count from every rank
#: (``average_tokens_across_devices``, on by default).
NUM_ITEMS_GATHER = "transformers: num_items_in_batch (gather across ranks)"
#: Named work: the model's forwards in eval mode or under no_grad inside a training step (a validation loop the
#: loop does not mark with ``perf.evaluation()``).
EVALUATION_FORWARDS = "evaluation forwards (eval mode or no_grad)"
RANK_WAITS: frozenset[str] = frozenset({NUM_ITEMS_GATHER})

#: The measured phases, in loop order.
PHASES: tuple[str, ...] = (DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER)

#: ARGB colours of the NVTX ranges, one per phase (Nsight Systems shows them).
PHASE_COLORS: dict[str, int] = {
    DATA_WAIT: 0xFFE8A317,  # amber
    FORWARD: 0xFF2E86DE,  # blue
    BACKWARD: 0xFF8E44AD,  # purple
    OPTIMIZER: 0xFF27AE60,  # green
    EVALUATION: 0xFF16A085,  # teal
    CHECKPOINT: 0xFFC0392B,  # red
    COMPILING: 0xFF7F8C8D,  # grey
}
