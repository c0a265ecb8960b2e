"""Process-wide settings: left to the system on a machine of one's own, changed on TFM_SHARED_CPU=1, and a user's
own OpenMP and malloc variables always win. Settings that change a process are checked in a fresh one."""

import os
import subprocess
import sys

import pytest
import torch

from tiny import ROOT
from transformer.process import OMP_KEYS, SHARED_CPU, SMALL_DECODE_ROWS, configure_openmp, decoding_threads, on_glibc


def fresh(code: str, **env: str) -> str:
    """stdout of ``code`` in a new Python process with only ``env`` of tfm's, malloc's and OpenMP's variables."""
    ours = (SHARED_CPU, *OMP_KEYS, "GLIBC_TUNABLES")
    clean = {k: v for k, v in os.environ.items() if k not in ours and not k.startswith("MALLOC_")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("env, spin", [({}, "None"), ({SHARED_CPU: "1"}, "10000"),
                                       ({SHARED_CPU: "1", "GOMP_SPINCOUNT": "5"}, "5"),
                                       ({SHARED_CPU: "1", "OMP_WAIT_POLICY": "PASSIVE"}, "None")])
def test_openmp_spins_briefly_only_on_a_shared_cpu_and_never_over_the_users_choice(monkeypatch, env, spin):
    for key in (SHARED_CPU, *OMP_KEYS):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    configure_openmp()
    assert str(os.environ.get("GOMP_SPINCOUNT")) == spin


def test_the_cli_sets_openmp_before_torch_loads():
    code = "import os, sys, cli.main; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    assert fresh(code, **{SHARED_CPU: "1"}) == "10000 False"
    assert fresh(code) == "None False"


@pytest.mark.parametrize("shared, rows, device, threads", [
    ("1", SMALL_DECODE_ROWS - 1, "cpu", 1), ("1", SMALL_DECODE_ROWS, "cpu", 2), ("1", 1, "cuda", 2), ("", 1, "cpu", 2)])
def test_small_batches_decode_on_one_thread_only_on_a_shared_cpu(monkeypatch, shared, rows, device, threads):
    monkeypatch.setenv(SHARED_CPU, shared)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with decoding_threads(torch.device(device), rows):
            assert torch.get_num_threads() == threads
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


KEEP = "from transformer.process import keep_freed_memory; print(keep_freed_memory())"


@pytest.mark.skipif(not on_glibc(), reason="glibc only")
def test_training_keeps_freed_memory_unless_the_user_tuned_malloc():
    assert fresh(KEEP) == "True"
    assert fresh(KEEP, MALLOC_TRIM_THRESHOLD_=str(128 * 1024)) == "False"
    assert fresh(KEEP, GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072") == "False"
