"""Training: the loop, one update, validation, the loss, the schedule, the run directory, signals, DDP, GPU levers
(CUDA graphs, prefetching) and checkpoint averaging."""
