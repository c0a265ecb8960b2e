"""Where and how the code runs: devices, precisions and their autocast, process-wide thread settings, and whether a
model fits in memory."""
