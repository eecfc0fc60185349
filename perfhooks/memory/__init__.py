"""Memory: the monitor (usage, peaks, near-limit captures and the OOM dump), OOM recognition and advice, and the
census of live tensors."""
