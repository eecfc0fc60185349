"""One step, light or detailed: the tracker's state machine (its light path and its detailed one), the step records,
the sampler that draws detailed steps, the run account, batch counting and the timing reader that reads the device's
marks."""
