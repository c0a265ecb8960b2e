"""Keep the memory a training step frees for the next one, instead of handing it back to the system.

glibc's malloc returns free memory at the top of its heap to the system (trimming) and serves
large blocks with mmap, unmapped again when freed. A training step's tensors change size with every
batch, so many steps faulted their memory in again: 50,000-150,000 page faults (about 2 us each) on
many base-shape steps. With mmap only for blocks over 32 MB and trimming only beyond 1 GB of free
heap, steps stop faulting once the heap has grown to its peak; peak RSS stayed within 1%. In paired
processes a step ran 1.01x and 1.06x as fast (base shape, two runs) and 1.01x and 1.05x (small);
bench/levers.py measures it. It changes the whole process, so only ``tfm train`` asks for it.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
MMAP_THRESHOLD = 32 * 2**20  # the largest value glibc accepts on a 64-bit system
TRIM_THRESHOLD = 2**30
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_")


def on_glibc() -> bool:
    """Whether this process runs on Linux's glibc, whose malloc ``mallopt`` tunes."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process; False (nothing set) elsewhere or if the user set them."""
    if not on_glibc():
        return False
    if any(k in os.environ for k in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = ctypes.CDLL(None)  # the C library the process already runs on
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
