"""keep_freed_memory: freed tensors' memory is reused without page faults, and a user's own malloc settings win.

Each case runs in a fresh process: the setting is process-wide, and it must not leak into the test process.
"""

import os
import subprocess
import sys

import pytest

from tiny import ROOT
from transformer.allocator import on_glibc

# Tensors of 12-28 MB made and freed, then ten of 24 MB made again: the page faults of the last round.
SCRIPT = """
import resource, torch
from transformer.allocator import keep_freed_memory
print(keep_freed_memory())
for n in (5_000_000, 3_000_000, 7_000_000):
    xs = [torch.empty(n).fill_(1) for _ in range(10)]
    del xs
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
xs = [torch.empty(6_000_000).fill_(1) for _ in range(10)]
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

glibc = pytest.mark.skipif(not on_glibc(), reason="glibc only")


def run(**env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**clean, "PYTHONPATH": str(ROOT), **env},
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1])


@glibc
def test_freed_memory_is_reused_without_page_faults():
    applied, faults = run()
    assert applied == "True"
    assert faults < 1000  # 240 MB made again from kept memory; with glibc's defaults, about 50,000 faults


@glibc
def test_glibc_defaults_fault_the_memory_in_again():
    """A user's own MALLOC_ setting is left alone: nothing set, and with this one the memory is faulted in again."""
    applied, faults = run(MALLOC_TRIM_THRESHOLD_=str(128 * 1024))
    assert applied == "False"
    assert faults > 10_000
