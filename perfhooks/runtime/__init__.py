"""The run itself: the engine (a state machine fed by training-loop events), the run's lifecycle (start, close,
exception, exit guard), step records, the run account of evaluation and checkpoint time, torch hooks and
instance patches that feed the engine, and the background worker."""
