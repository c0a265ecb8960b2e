"""Code of the search and the Translator that exists only for speed, kept apart so that search.py reads as the
algorithm.

Each piece computes what the plain PyTorch call it stands for computes; ``python -m bench.levers`` measures them.
"""

from __future__ import annotations

import copy
import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.model.transformer import StackedLinear, Transformer


def row_topk(x: Tensor, m: int, block: int = 100) -> tuple[Tensor, Tensor]:
    """``x.topk(m, dim=1)`` for rows over a large vocabulary, found through block maxima.

    A row's m largest values lie in the m blocks of ``block`` columns with the largest maxima, so one
    max per block, a top-m over blocks and a top-m over their m * block values find them.
    """
    R, V = x.shape
    if V % block or V < 4 * m * block:
        return x.topk(m, dim=1)
    blocks = x.view(R, V // block, block)
    _, chosen = blocks.amax(-1).topk(m, dim=1)  # [R, m] block numbers
    values, j = blocks.gather(1, chosen[..., None].expand(R, m, block)).view(R, m * block).topk(m, dim=1)
    return values, chosen.gather(1, j // block) * block + j % block


def matmul_weights_in(model: Transformer, dtype: torch.dtype) -> Transformer:
    """A frozen copy of ``model`` whose Linear weights and biases are cast to ``dtype`` once, for decoding under
    autocast.

    Autocast caches no casts under inference mode, so every decoding step would cast every weight
    again. Cast ahead, the outputs are the same: autocast rounds the same weights the same way. The
    generator gets its own copy of the tied embedding table, so embeddings stay in fp32 as under autocast.
    """
    half = copy.deepcopy(model)
    half.eval().requires_grad_(False)
    half.generator.weight = nn.Parameter(half.generator.weight.detach().to(dtype), requires_grad=False)
    for module in half.modules():
        if isinstance(module, nn.Linear):
            module.to(dtype)
    return half


PACK_ROWS = 32  # the rows oneDNN packs the weights for; measured as fast from 2 rows to 160 as packing for each


def onednn_linear_available() -> bool:
    """Whether this is an x86 CPU (where it was measured) and torch has oneDNN's linear on packed weights
    (``torch.ops.mkldnn._linear_pointwise``, the kernel torch.compile's CPU backend gives frozen Linear layers)."""
    ops = torch.ops.mkldnn
    return (
        platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and all(hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight"))
    )


class StepLinear(nn.Module):
    """x W^T + b for fp32 decoding on the CPU, laid out for a decoding step's few rows; the same product up to float
    rounding.

    A step reads every weight matrix for a few rows, so reading the weights is what it waits on. One row (greedy
    search, one sentence): W as stored, cut into ``p`` blocks of output rows and applied as one batched matmul, so
    that p threads each read a block (as one matmul, a single row keeps one thread reading). More rows: oneDNN's
    linear on weights packed once (``onednn_linear_available``), faster than torch's default matmul at those
    shapes; F.linear where this torch lacks it.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, p: int) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.p = max(d for d in range(1, p + 1) if self.out_features % d == 0)
        w = weight.detach()
        b = torch.zeros(self.out_features, dtype=w.dtype, device=w.device) if bias is None else bias.detach()
        self.weight, self.bias = w, b  # the model's own tensors, not copies
        self.blocks, self.block_bias = w.view(self.p, -1, self.in_features), b.view(self.p, -1, 1)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) if onednn_linear_available() else None

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2:
            return self.forward(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        if x.size(0) == 1:
            return torch.baddbmm(self.block_bias, self.blocks, x.t().expand(self.p, -1, -1)).view(1, -1)
        if self.packed is not None and x.dtype == self.weight.dtype:  # not under an autocast
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class StepParts(nn.Module):
    """A StackedLinear that decoding applies only in parts (cross-attention: its query rows at every step, its key
    and value rows once per sentence), as one StepLinear per part."""

    def __init__(self, linear: StackedLinear, p: int, parts: tuple[slice, ...]) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(
            {f"{s.start}:{s.stop}": StepLinear(linear.weight[s], linear.bias[s], p) for s in parts}
        )
        self._forwards = {(s.start, s.stop): self.parts[f"{s.start}:{s.stop}"].forward for s in parts}

    def part(self, x: Tensor, rows: slice) -> Tensor:
        return self._forwards[rows.start, rows.stop](x)


def for_cpu_decoding(model: Transformer, p: int) -> Transformer:
    """``model`` for fp32 decoding on the CPU: a copy whose decoder matrices and generator are StepLinears for ``p``
    threads (torch's thread count), sharing every module and parameter (oneDNN's packed weights are one more copy
    of the decoder's matrices and of the output table). A model already made so is returned as it is."""
    if isinstance(model.generator, StepLinear):
        return model
    fast = copy.copy(model)
    fast._modules = dict(model._modules)
    fast.decoder = copy.deepcopy(model.decoder, memo={id(t): t for t in model.decoder.parameters()})
    for layer in fast.decoder.layers:
        cross = layer.cross_attn
        cross.in_proj = StepParts(cross.in_proj, p, (cross.query_rows, cross.key_value_rows))
    for module in list(fast.decoder.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.Linear):
                setattr(module, name, StepLinear(child.weight, child.bias, p))
    fast.generator = StepLinear(model.generator.weight, None, p)
    return fast
