"""Label-smoothed cross-entropy that ignores padding, with the unsmoothed NLL beside it.

Smoothing mixes eps/V of uniform mass into the target distribution, the target
included (as ``nn.CrossEntropyLoss(label_smoothing=eps)`` does). Both values are
sums over non-pad target tokens, so the caller divides by the token count of the
whole update, however many micro-batches it spans.

The loss is one autograd function with a hand-written backward,
``(softmax - smoothed target) * keep``, computed in place from the saved log-probabilities:
with an 8,000-token vocabulary the [tokens, V] tensors dominate the loss's cost, and autograd's
chain (mean, gather, masked_fill, log_softmax backward) made about twice as many passes over them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class _SmoothedNLL(torch.autograd.Function):
    """(smoothed loss sum, NLL sum) of logits [N, V] (any float dtype, computed in fp32) against target [N]."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
        lprobs = F.log_softmax(logits.float(), dim=-1)
        keep = target != pad_id
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        smooth = -lprobs.mean(dim=-1)
        nll_sum = nll.masked_fill(~keep, 0.0).sum()
        loss = (1.0 - eps) * nll_sum + eps * smooth.masked_fill(~keep, 0.0).sum()
        ctx.save_for_backward(lprobs, target, keep)
        ctx.eps, ctx.in_dtype = eps, logits.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None, None]:
        lprobs, target, keep = ctx.saved_tensors
        eps, V = ctx.eps, lprobs.size(-1)
        scale = (keep.to(lprobs.dtype) * grad_loss).unsqueeze(-1)  # [N, 1]: 0 on padding
        grad = torch.addcmul(scale * (-eps / V), lprobs.exp_(), scale)  # (softmax - eps/V) * scale
        grad.scatter_add_(-1, target.unsqueeze(-1), scale * -(1.0 - eps))  # minus (1 - eps) at the target
        return grad.to(ctx.in_dtype), None, None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Return (smoothed loss sum, NLL sum) over the non-pad positions of ``target``; computed in fp32.

    logits [..., V] and target [...]; only the loss carries a gradient (the NLL is for logging).
    """
    loss, nll = _SmoothedNLL.apply(logits.reshape(-1, logits.size(-1)), target.reshape(-1), eps, pad_id)
    return loss, nll
