"""Process-wide settings: left to the system on a machine of one's own, changed on TFM_SHARED_CPU=1, and a user's
own OpenMP, malloc and oneDNN variables always win. Settings that change a process are checked in a fresh one."""

import os
import subprocess
import sys

import pytest
import torch
from tiny import ROOT

from transformer.runtime.process import (
    OMP_KEYS,
    ONEDNN_CACHE_KEYS,
    PRIMITIVE_CACHE_CAPACITY,
    SHARED_CPU,
    SMALL_DECODE_ROWS,
    configure_openmp,
    decoding_threads,
)


def fresh(code: str, **env: str) -> str:
    """stdout of ``code`` in a new Python process with only ``env`` of tfm's, malloc's, OpenMP's and oneDNN's
    variables."""
    ours = (SHARED_CPU, *OMP_KEYS, *ONEDNN_CACHE_KEYS, "GLIBC_TUNABLES", "ONEDNN_VERBOSE")
    clean = {k: v for k, v in os.environ.items() if k not in ours and not k.startswith("MALLOC_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.mark.parametrize(
    "env, spin",
    [
        ({}, "None"),
        ({SHARED_CPU: "1"}, "10000"),
        ({SHARED_CPU: "1", "GOMP_SPINCOUNT": "5"}, "5"),
        ({SHARED_CPU: "1", "OMP_WAIT_POLICY": "PASSIVE"}, "None"),
    ],
)
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


@pytest.mark.parametrize(
    "env, capacity",
    [
        ({}, PRIMITIVE_CACHE_CAPACITY),
        ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}, "64"),
        ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "64"}, "None"),
    ],
)
def test_the_cli_sizes_onednns_cache_before_torch_loads_unless_the_user_did(env, capacity):
    code = "import os, sys, cli.main; print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'), 'torch' in sys.modules)"
    assert fresh(code, **env) == f"{capacity} False"


SHAPES = """
import cli.main, torch
linear = torch.nn.Linear(64, 64)
with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
    for m in range(2, 1202):
        linear(torch.ones(m, 64))
    print("again", flush=True)
    linear(torch.ones(2, 64))
"""


def test_bf16_matmuls_of_1200_shapes_stay_in_onednns_cache():
    """oneDNN's default cache (1,024) would have evicted the first of 1,200 shapes; tfm's keeps it."""
    out = fresh(SHAPES, ONEDNN_VERBOSE="profile_create")
    if "primitive,create" not in out:
        pytest.skip("bf16 matmuls do not run through oneDNN on this CPU")
    assert out.count("create:cache_miss") >= 1200
    assert "primitive,create:cache_hit" in out.split("again", 1)[1]


@pytest.mark.parametrize(
    "shared, rows, device, threads",
    [
        ("1", SMALL_DECODE_ROWS - 1, "cpu", 1),
        ("1", SMALL_DECODE_ROWS, "cpu", 2),
        ("1", 1, "cuda", 2),
        ("", 1, "cpu", 2),
    ],
)
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
