"""Encoder-decoder attention folded into its projections, swapped into a decoder layer for decoding on a CPU.

For a query row y and a sentence's encoder keys K_h and values V_h (head h), cross-attention is

    sum_h softmax((y W_q,h^T + b_q,h) K_h^T / sqrt(d_k)) V_h W_o,h^T + b_o
  = sum_h softmax(y A_h^T + c_h) B_h + b_o,    A_h = K_h W_q,h / sqrt(d_k),  c_h = K_h b_q,h / sqrt(d_k),
                                               B_h = V_h W_o,h^T,

with A_h, c_h and B_h computed once per sentence. A step then multiplies by A and B (h S rows of d_model each per
sentence of S source positions) instead of W_q and W_o (d_model rows each, shared) and K, V (S rows of d_model): two
batched matmuls and a softmax instead of two projections and an attention call, and fewer values to read while
sentences * S * (h - 1) < d_model (``worth_folding``), which holds when decoding one or a few sentences.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer.config import ModelConfig
from transformer.model.transformer import MultiHeadAttention


def worth_folding(sentences: int, S: int, h: int, d_model: int) -> bool:
    """Whether a step reads fewer values folded: sentences * 2 h S d_model < 2 d_model^2 + sentences * 2 S d_model."""
    return sentences * S * (h - 1) < d_model


class FoldedCrossAttention(MultiHeadAttention):
    """``attention`` (its projections as swapped in for decoding) whose decoding steps run folded for a batch of few
    sentences; ``source`` holds the float weights it is folded from (the same attention, or the original of an int8
    copy). Other batches, and whole sequences, go through the attention it stands for."""

    def __init__(self, attention: MultiHeadAttention, source: MultiHeadAttention) -> None:
        with torch.device("meta"):  # projections that the attention's replace: no memory, no draws from the RNG
            super().__init__(
                ModelConfig(d_model=attention.h * attention.d_k, h=attention.h, attention_dropout=attention.dropout)
            )
        self.in_proj, self.out_proj = attention.in_proj, attention.out_proj
        self.train(attention.training)
        h, d_k, rows = source.h, source.d_k, source.query_rows
        w, b = source.in_proj.weight.detach(), source.in_proj.bias.detach()
        w_q, b_q, w_o = w[rows], b[rows], source.out_proj.weight.detach()
        d_model, scale = w_q.size(1), 1 / math.sqrt(d_k)
        # W_q,h / sqrt(d_k) and W_o,h^T per head [2, h, d_k, d_model]; b_q,h / sqrt(d_k) [h, d_k, 1]; b_o
        self.fold_w = torch.stack([w_q.view(h, d_k, d_model) * scale, w_o.view(d_model, h, d_k).permute(1, 2, 0)])
        self.fold_b, self.b_o = b_q.view(h, d_k, 1) * scale, source.out_proj.bias.detach()

    def memory_state(self, memory: Tensor, mask: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
        """A and B [n, 2, h S, d_model] and the scores' additive bias [n, 1, h S] (c, and -inf where ``mask`` hides a
        key) when ``worth_folding``; else K, V and the mask, as unfolded."""
        kv, mask = super().memory_state(memory, mask, rows)
        n, _, h, S, d_k = kv.shape
        if not worth_folding(n, S, h, h * d_k):
            return kv, mask
        ab = kv @ self.fold_w  # [n, 2, h, S, d_model]: K_h W_q,h / sqrt(d_k) and V_h W_o,h^T
        bias = (kv[:, 0] @ self.fold_b).view(n, h, S).masked_fill(~mask.view(n, 1, S), float("-inf"))
        return ab.view(n, 2, h * S, -1), bias.view(n, 1, h * S)

    def cross_step(self, x: Tensor, kv: Tensor, mask: Tensor) -> Tensor:
        """Rows x [R, d_model], R / n consecutive rows per sentence: folded when ``memory_state`` folded (a float
        score bias comes with A and B, a bool mask with K and V)."""
        if mask.dtype == torch.bool:
            return super().cross_step(x, kv, mask)
        n, _, hS, d_model = kv.shape
        beams = x.size(0) // n
        scores = torch.baddbmm(mask, x.view(n, beams, d_model), kv[:, 0].transpose(1, 2))  # [n, beams, h S]
        probs = scores.view(n, beams, self.h, hS // self.h).softmax(-1).view(n, beams, hS)
        return torch.baddbmm(self.b_o, probs, kv[:, 1]).view(-1, d_model)
