"""Model FLOPs utilisation (MFU): the model FLOPs training computes per second, over the card's bf16 matmul peak.

FLOPs are those of matmuls (2 per multiply-add) on the tensors a step computes, each sentence padded to its
batch's longest (the empty rows ``train.static_shapes`` adds are no one's model FLOPs and are left out); the
backward pass counts twice the forward, as nanoGPT's estimate_mfu counts it; attention score matrices count whole,
the causal half included. The peak is the card's dense (not sparse) bf16 tensor-core figure from its datasheet,
or for a card not in the table the best of a few large bf16 matmuls timed here.
"""

from __future__ import annotations

import re
import time

import torch

from transformer.config import ModelConfig

DENSE_BF16_TFLOPS = [  # (pattern in torch.cuda.get_device_name(), datasheet dense bf16 TFLOP/s), first match wins
    (r"H100.*PCIe", 756.0),
    (r"H100.*NVL", 835.0),
    (r"H100", 989.0),  # SXM: "NVIDIA H100 80GB HBM3"
    (r"H200.*NVL", 835.0),
    (r"H200", 989.0),
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"\bL4\b", 121.0),
]


def forward_flops(m: ModelConfig, vocab: int, batch: int, src_len: int, tgt_len: int) -> float:
    """Matmul FLOPs of one teacher-forced forward pass over a [batch, src_len] x [batch, tgt_len] batch."""
    d, f, B, S, T = m.d_model, m.d_ff, batch, src_len, tgt_len
    encoder = m.depths[0] * (2 * B * S * (4 * d * d + 2 * d * f) + 2 * 2 * B * S * S * d)
    self_attn = 2 * B * T * 4 * d * d + 2 * 2 * B * T * T * d
    cross = 2 * B * T * 2 * d * d + 2 * B * S * 2 * d * d + 2 * 2 * B * T * S * d
    decoder = m.depths[1] * (self_attn + cross + 2 * B * T * 2 * d * f)
    return float(encoder + decoder + 2 * B * T * d * vocab)


def train_flops(m: ModelConfig, vocab: int, batch: int, src_len: int, tgt_len: int) -> float:
    """Forward plus backward (twice the forward)."""
    return 3 * forward_flops(m, vocab, batch, src_len, tgt_len)


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Best GFLOP/s of an n x n matmul in ``dtype`` over ``repeats`` tries (best, not median: it is a ceiling).

    Random operands (zeros run faster on a GPU); on a GPU each try is synchronized before the clock is read.
    """
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def bf16_peak(device: torch.device) -> tuple[float, str] | None:
    """A CUDA card's bf16 matmul peak in FLOP/s and where the figure comes from; None off CUDA."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for pattern, tflops in DENSE_BF16_TFLOPS:
        if re.search(pattern, name):
            return tflops * 1e12, f"{name}, datasheet dense bf16"
    measured = matmul_peak(torch.bfloat16, n=8192, repeats=5, device=device)
    return measured * 1e9, f"{name}, measured: best of 5 bf16 matmuls of 8192 x 8192"
