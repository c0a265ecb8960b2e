"""Label-smoothed cross-entropy that ignores padding, with the unsmoothed NLL beside it.

Smoothing mixes eps/V of uniform mass into the target distribution, the target
included (as ``nn.CrossEntropyLoss(label_smoothing=eps)`` does). Both values are
sums over non-pad target tokens, so the caller divides by the token count of the
whole update, however many micro-batches it spans.

``label_smoothed_nll`` scores whole logits: the plain definition, which tests and the benchmarks'
whole-logits side use. Training and validation use ``generator_loss``, which fuses the output
projection with the loss: logits are made a chunk of rows at a time (``chunk_loss``) and (in training)
turned into their gradient, ``(softmax - smoothed target) * keep``, while still in cache, so the
[tokens, V] logits never exist whole: faster on a CPU, and less memory everywhere (``python -m
bench.levers`` and ``bench.gpu`` measure it against whole logits).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

CPU_CHUNK = 128  # rows of logits made at once on a CPU: about 4 MB at V = 8,000, so they stay in cache
GPU_CHUNK_ELEMENTS = 2**26  # on a GPU, logits of up to 256 MB at once: a few large kernels instead of many small ones


def chunk_rows(device: torch.device, V: int) -> int:
    """Rows of logits ``generator_loss`` makes at once: cache-sized on a CPU, large on a GPU (small chunks there
    mean hundreds of small kernels per step)."""
    return CPU_CHUNK if device.type == "cpu" else max(CPU_CHUNK, GPU_CHUNK_ELEMENTS // V)


def label_smoothed_nll(logits: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Return (smoothed loss sum, NLL sum) over the non-pad positions of ``target``; computed in fp32."""
    lprobs = F.log_softmax(logits.float(), dim=-1)
    keep = target != pad_id
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    smooth_sum = smooth.masked_fill(~keep, 0.0).sum()
    return (1.0 - eps) * nll_sum + eps * smooth_sum, nll_sum


def chunk_loss(hc: Tensor, w: Tensor, tc: Tensor, kc: Tensor, eps: float, grads: bool) -> tuple[Tensor, ...]:
    """One chunk of rows: (smoothed loss sum, NLL sum) of ``hc @ w.T`` and, with ``grads``, the logits' gradient
    ``(softmax - smoothed target) * keep`` in hc's dtype. hc [n, d] and w [V, d] in the matmul dtype, tc [n, 1]
    the targets, kc [n, 1] 1 for a real target and 0 for padding. Softmax and loss in fp32.

    Every pass over the [n, V] logits is a read and a write of the whole chunk: compiled (``generator_loss``'s
    ``chunk``), the passes fuse into a few kernels that read the logits once or twice.
    """
    V = w.size(0)
    logits = (hc @ w.t()).float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    nll = ((lse - logits.gather(1, tc)) * kc).sum()
    loss = (1.0 - eps) * nll + eps * ((lse - logits.mean(-1, keepdim=True)) * kc).sum()
    if not grads:
        return loss, nll
    g = logits.sub_(lse).exp_().sub_(eps / V).mul_(kc)  # (softmax - eps/V) * keep, in place
    g.scatter_add_(1, tc, kc * -(1.0 - eps))  # minus (1 - eps) at the target
    return loss, nll, g.to(hc.dtype)


Chunk = Callable[[Tensor, Tensor, Tensor, Tensor, float, bool], tuple[Tensor, ...]]


class _GeneratorLoss(torch.autograd.Function):
    """(smoothed loss sum, NLL sum) of ``hidden @ weight.T`` against target, gradients made in the forward pass.

    hidden [N, d], weight [V, d], target [N]. Matmuls run in ``dtype`` (the autocast dtype, or the
    inputs' own), softmax and loss in fp32. The backward only scales the saved gradients.
    """

    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        eps: float,
        pad_id: int,
        dtype: torch.dtype,
        grads: bool,
        chunk: Chunk,
    ) -> tuple[Tensor, Tensor]:
        h, w = hidden.to(dtype), weight.to(dtype)
        grad_h = torch.empty_like(h) if grads else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grads else None
        keep = (target != pad_id).float()
        loss = hidden.new_zeros((), dtype=torch.float32)
        nll = hidden.new_zeros((), dtype=torch.float32)
        rows = chunk_rows(hidden.device, weight.size(0))
        for s in range(0, h.size(0), rows):
            hc = h[s : s + rows]
            loss_c, nll_c, *g = chunk(hc, w, target[s : s + rows, None], keep[s : s + rows, None], eps, grads)
            loss += loss_c
            nll += nll_c
            if grads:
                torch.mm(g[0], w, out=grad_h[s : s + rows])
                if dtype == torch.float32:
                    grad_w.addmm_(g[0].t(), hc)
                else:
                    grad_w += (g[0].t() @ hc).float()
        ctx.mark_non_differentiable(nll)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = hidden.dtype, weight.dtype
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        return (
            (grad_h.float() * grad_loss).to(ctx.dtypes[0]),
            (grad_w * grad_loss).to(ctx.dtypes[1]),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def generator_loss(
    hidden: Tensor, weight: Tensor, target: Tensor, eps: float, pad_id: int, chunk: Chunk = chunk_loss
) -> tuple[Tensor, Tensor]:
    """``label_smoothed_nll(hidden @ weight.T, target, ...)`` without making the logits whole.

    hidden [..., d_model] (the decoder's output), weight [V, d_model] (the generator's), target [...].
    Under autocast the projection runs in the autocast dtype, as nn.Linear would. ``chunk`` scores each chunk of
    rows: ``chunk_loss``, or the same compiled (training under ``train.compile``).
    """
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(device, enabled=False):
        return _GeneratorLoss.apply(
            hidden.reshape(-1, hidden.size(-1)), weight, target.reshape(-1), eps, pad_id, dtype, grads, chunk
        )
