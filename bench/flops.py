"""Model FLOPs of a training step, and the machine's matmul peak measured in the same run (for MFU).

FLOPs are counted on the padded tensors the step really computes, matmuls only (2 per
multiply-add), the backward pass counted as twice the forward (nanoGPT's estimate_mfu does the
same); full attention score matrices are counted, the causal half included.
"""

from __future__ import annotations

import time

import torch

from transformer.config import ModelConfig


def forward_flops(m: ModelConfig, vocab: int, batch: int, src_len: int, tgt_len: int) -> float:
    """Matmul FLOPs of one teacher-forced forward pass over a [batch, src_len] x [batch, tgt_len] batch."""
    d, f, B, S, T = m.d_model, m.d_ff, batch, src_len, tgt_len
    encoder = m.N * (2 * B * S * (4 * d * d + 2 * d * f) + 2 * 2 * B * S * S * d)
    self_attn = 2 * B * T * 4 * d * d + 2 * 2 * B * T * T * d
    cross = 2 * B * T * 2 * d * d + 2 * B * S * 2 * d * d + 2 * 2 * B * T * S * d
    decoder = m.N * (self_attn + cross + 2 * B * T * 2 * d * f)
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
