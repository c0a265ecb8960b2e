"""Device and precision from the config: one place that turns names into torch objects."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ContextManager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.errors import ConfigError


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the half precisions, by config name


def resolve_device(name: str) -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; an explicit device that is absent is a config error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda but this machine has no CUDA GPU (or torch is a CPU build); use device: auto or cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device: mps but MPS is not available here; use device: auto or cpu")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> str:
    """``auto``: bf16 on a CUDA GPU with bf16 tensor cores (compute capability 8.0 and up: A100, RTX 30xx, H100),
    fp16 with loss scaling on older ones (V100, T4), fp32 elsewhere; other names are returned as they are.

    fp32 on CPUs because bf16 does not pay on all of them: this project's 2-core CPU (AVX-512 BF16, no
    AMX) ran bf16 matmuls at half its fp32 peak and bf16 training steps at 0.55-0.66x of fp32. On an
    H100, bf16 trained the base model 3.5x as fast as fp32 at 25,000-token batches (README).
    """
    if name != "auto":
        return name
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"


def check_precision(precision: str, device: torch.device) -> None:
    """fp32, bf16 or fp16; fp16 needs a GPU (CPU fp16 matmuls are slow and GradScaler is CUDA-only here)."""
    if precision not in ("fp32", *DTYPES):
        raise ConfigError(f"precision '{precision}' is not one of fp32, {', '.join(DTYPES)}; pick one of them")
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"precision: fp16 needs a CUDA GPU but the device is {device.type}; use precision: bf16 or fp32")


def autocast(precision: str, device: torch.device) -> ContextManager:
    """Mixed precision for the forward pass; fp32 is a no-op context."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def fused_adam(device: torch.device) -> bool:
    """Whether Adam's fused kernel (one pass over all parameters) runs on ``device``: CUDA, and CPU from torch 2.4.

    One kernel over all parameters instead of a loop of small ones per tensor. On the 2-core CPU the
    optimizer step is a small part of a training step, which ran 0.96-1.08x as fast with it over
    five runs (bench/levers.py); the benchmarks give the Marian peer the same optimizer.
    """
    if device.type == "cuda":
        return True
    return device.type == "cpu" and torch.torch_version.TorchVersion(torch.__version__) >= (2, 4)


SMALL_DECODE_ROWS = 64


@contextlib.contextmanager
def decoding_threads(device: torch.device, rows: int) -> Iterator[None]:
    """Decode on one intra-op CPU thread when the batch has fewer than 64 rows (sentences x beam).

    A step of a small batch is a hundred tiny ops, and a second thread pays only when it is idle and
    awake. On the 2-core CPU, with nothing else running, one thread made 100 single sentences
    0.85-0.87x as fast; but with CTranslate2's threads spinning in the same process (bench/run.py),
    two threads made greedy decoding 2.4x slower at batch 1 and 1.7x at batch 32, and with idle
    threads sleeping at once (OMP_WAIT_POLICY=PASSIVE) one thread was about 2x faster. A shared
    machine is the common case, so small batches take one thread; 160 rows (32 sentences x beam 5)
    ran 7% slower on one, so larger batches use all.
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or rows >= SMALL_DECODE_ROWS or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def shape_changing_attention(device: torch.device) -> ContextManager:
    """SDPA without its cuDNN backend on CUDA, for attention whose shapes change at every call.

    Recent PyTorch builds prefer cuDNN attention on Hopper GPUs (H100, H200) in bf16 and fp16, and
    cuDNN builds an execution plan for each new shape. Incremental decoding grows the key length by
    one every step, and unpadded training batches rarely repeat a shape. With torch 2.11 and CUDA 13,
    bf16 decoding ran 7-20x slower than fp32 on an H200, and a bf16 base-shape training step on a
    new shape 8x slower on an H100. Flash, memory-efficient and math kernels need no plans.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


FLASH_FROM_LENGTH = 256


def training_attention(device: torch.device, length: int) -> ContextManager:
    """SDPA's kernels for a whole-sequence pass over a batch whose longest sequence is ``length`` positions (CUDA).

    Never cuDNN (see ``shape_changing_attention``), and the flash kernel only from 256 positions: below,
    the memory-efficient kernel is faster. On an H100 in bf16 (h=8, d_k=64, 25,000 tokens a batch),
    causal attention forward and backward took 2.1x as long with flash at 32 positions, 1.05x at 192
    and 0.78x at 256; a base-shape step on Multi30k's 25,000-token batches ran 1.07-1.09x faster without it.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    if length < FLASH_FROM_LENGTH:
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    return shape_changing_attention(device)
