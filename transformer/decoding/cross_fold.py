"""Cross-attention folded into its projections, for decoding a few sentences at a time.

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

from transformer.model.decoder_state import DecoderState
from transformer.model.transformer import MultiHeadAttention


def worth_folding(sentences: int, S: int, h: int, d_model: int) -> bool:
    """Whether a step reads fewer values folded: sentences * 2 h S d_model < 2 d_model^2 + sentences * 2 S d_model."""
    return sentences * S * (h - 1) < d_model


def fold_weights(cross: MultiHeadAttention) -> tuple[Tensor, Tensor]:
    """What ``fold`` multiplies K and V by, from a cross-attention's float projections: W_q,h / sqrt(d_k) and
    W_o,h^T per head [2, h, d_k, d_model], and b_q,h / sqrt(d_k) [h, d_k, 1]; made once per layer."""
    h, d_k, rows = cross.h, cross.d_k, cross.query_rows
    w, b = cross.in_proj.weight.detach(), cross.in_proj.bias.detach()
    w_q, b_q, w_o = w[rows], b[rows], cross.out_proj.weight.detach()
    d_model = w_q.size(1)
    scale = 1 / math.sqrt(d_k)
    w = torch.stack([w_q.view(h, d_k, d_model) * scale, w_o.view(d_model, h, d_k).permute(1, 2, 0)])
    return w, b_q.view(h, d_k, 1) * scale


def fold(kv: Tensor, keep: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """One layer's A and B [n, 2, h S, d_model], and the scores' additive bias [n, 1, h S] (c, and -inf where
    ``keep`` [n, 1, 1, S] masks a key), from its cross-attention K and V, kv [n, 2, h, S, d_k], and ``fold_weights``."""
    n, _, h, S, _ = kv.shape
    ab = kv @ w  # [n, 2, h, S, d_model]: K_h W_q,h / sqrt(d_k) and V_h W_o,h^T
    bias = (kv[:, 0] @ b).view(n, h, S).masked_fill(~keep.view(n, 1, S), float("-inf"))
    return ab.view(n, 2, h * S, -1), bias.view(n, 1, h * S)


def attend(y: Tensor, ab: Tensor, bias: Tensor, b_o: Tensor, h: int, beam: int) -> Tensor:
    """Cross-attention with its projections for rows y [R, d_model], ``beam`` consecutive rows per sentence of ``ab``
    and ``bias`` (``fold``'s)."""
    n, _, hS, d_model = ab.shape
    scores = torch.baddbmm(bias, y.view(n, beam, d_model), ab[:, 0].transpose(1, 2))  # [n, beam, h S]
    probs = scores.view(n, beam, h, hS // h).softmax(-1).view(n, beam, hS)
    return torch.baddbmm(b_o, probs, ab[:, 1]).view(-1, d_model)


class FoldedState(DecoderState):
    """A fresh DecoderState whose per-sentence cross-attention tensors are the folded ones: ``cross_kv`` holds each
    layer's A and B [sentences, N, 2, h S, d_model], ``src_mask`` each layer's score bias [sentences, N, 1, h S].
    ``select`` keeps and drops sentences of both as it does K, V and the mask."""

    def __init__(self, state: DecoderState, cross: Tensor, bias: Tensor) -> None:
        vars(self).update(vars(state))  # the self-attention cache and its buffers, as the fresh state made them
        self.cross_kv, self.src_mask = cross, bias
