"""Process-wide settings: how OpenMP threads wait, how many threads decode, how many matmul kernels oneDNN
keeps.

They change the whole process, so only the entry points (``cli`` and ``bench``) apply them, and a
user's own environment variables always win. The defaults suit a machine of one's own. Where other
jobs share the CPU, ``TFM_SHARED_CPU=1`` makes idle OpenMP threads sleep soon instead of spinning
and decodes small batches on one thread, so that tfm's threads do not wait on busy cores
(measured by ``python -m bench.levers``). torch is imported late so ``configure_before_torch`` can run first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SHARED_CPU = "TFM_SHARED_CPU"
OMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SHORT_SPIN = "10000"  # libgomp's default is 300,000 rounds of spinning before an idle thread sleeps
SMALL_DECODE_ROWS = 64

ONEDNN_CACHE_KEYS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")
PRIMITIVE_CACHE_CAPACITY = "16384"  # oneDNN's default is 1,024


def shared_cpu() -> bool:
    """Whether the user said other jobs share this machine's CPU (``TFM_SHARED_CPU=1``)."""
    return os.environ.get(SHARED_CPU, "").strip().lower() in ("1", "true", "yes", "on")


def configure_openmp() -> None:
    """On a shared CPU, let idle OpenMP threads spin briefly, then sleep; must run before torch starts OpenMP."""
    if shared_cpu() and not any(k in os.environ for k in OMP_KEYS):
        os.environ["GOMP_SPINCOUNT"] = SHORT_SPIN


def configure_onednn() -> None:
    """Let oneDNN keep 16,384 matmul primitives, not 1,024, unless the user chose; must run before its first matmul.

    bf16 matmuls on a CPU run through oneDNN, which builds a primitive (a kernel for one shape) per new
    shape, at a cost above that of running it. Token-sized training batches and the greedy decoding of
    validation bring well over a thousand shapes; with 1,024 kept, the cache evicts and rebuilds them for the rest
    of the run (bench/README.md lists the runs that measured it).
    """
    if not any(k in os.environ for k in ONEDNN_CACHE_KEYS):
        os.environ[ONEDNN_CACHE_KEYS[0]] = PRIMITIVE_CACHE_CAPACITY


def configure_before_torch() -> None:
    """OpenMP's waiting and oneDNN's cache, which must be set before torch loads: each entry point calls this first."""
    configure_openmp()
    configure_onednn()


@contextlib.contextmanager
def decoding_threads(device: torch.device, rows: int) -> Iterator[None]:
    """On a shared CPU, decode batches of fewer than 64 rows (sentences x beam) on one intra-op thread.

    A step of a small batch is a hundred tiny ops; a second thread pays only when its core is idle.
    """
    import torch  # here, not at the top: configure_openmp must be able to run before torch loads

    threads = torch.get_num_threads()
    if not shared_cpu() or device.type != "cpu" or rows >= SMALL_DECODE_ROWS or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
