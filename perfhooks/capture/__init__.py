"""What a run records beyond its timings: the capture schedule (a pure function of the step), ``torch.profiler``
windows, the on-demand trigger, NVTX ranges and profiler labels, and the job that analyses a written window."""
