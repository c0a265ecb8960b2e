"""Label-smoothed cross-entropy that ignores padding, with the unsmoothed NLL beside it.

Smoothing mixes eps/V of uniform mass into the target distribution, the target
included (as ``nn.CrossEntropyLoss(label_smoothing=eps)`` does). Both values are
sums over non-pad target tokens, so the caller divides by the token count of the
whole update, however many micro-batches it spans.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, eps: float, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (smoothed loss sum, NLL sum) over the non-pad positions of ``target``; computed in fp32."""
    lprobs = F.log_softmax(logits.float(), dim=-1)
    keep = target != pad_id
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    smooth_sum = smooth.masked_fill(~keep, 0.0).sum()
    return (1.0 - eps) * nll_sum + eps * smooth_sum, nll_sum
