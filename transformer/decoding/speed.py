"""Code of the search and the Translator that exists only for speed, kept apart so that search.py reads as the
algorithm.

Each piece computes what the plain PyTorch call it stands for computes; ``python -m bench.levers`` measures them.
"""

from __future__ import annotations

import copy

import torch
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


class SplitLinear(nn.Module):
    """x W^T + b for decoding on the CPU: W^T kept contiguous and cut into ``p`` blocks of output columns, applied
    as one batched matmul ([p, in, out / p]).

    A decoding step multiplies a few rows by each weight matrix, so it is bound by reading the weights. As one
    matmul those few rows keep one thread reading; as p blocks of a batched matmul, p threads each read a block.
    W^T rather than W as stored ([out, in]): for a few rows the matmul takes a faster path against it.
    The product is the same up to float rounding. An output width that p does not divide gets fewer blocks.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, p: int) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.p = max(d for d in range(1, p + 1) if self.out_features % d == 0)
        w = weight.detach()
        b = torch.zeros(self.out_features, dtype=w.dtype, device=w.device) if bias is None else bias.detach()
        blocks = w.view(self.p, self.out_features // self.p, self.in_features).transpose(1, 2).contiguous()
        self.register_buffer("weight_t", blocks, persistent=False)  # [p, in, out / p]
        self.register_buffer("bias_t", b.reshape(self.p, 1, -1).clone(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        y = torch.baddbmm(self.bias_t, rows.expand(self.p, -1, -1), self.weight_t)  # [p, rows, out / p]
        return y.transpose(0, 1).reshape(*x.shape[:-1], self.out_features)


class SplitParts(nn.Module):
    """A StackedLinear that decoding applies only in parts (cross-attention: its query rows at every step, its key
    and value rows once per sentence), as one SplitLinear per part."""

    def __init__(self, linear: StackedLinear, p: int, parts: tuple[slice, ...]) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(
            {f"{s.start}:{s.stop}": SplitLinear(linear.weight[s], linear.bias[s], p) for s in parts}
        )

    def part(self, x: Tensor, rows: slice) -> Tensor:
        return self.parts[f"{rows.start}:{rows.stop}"](x)


def split_for_decoding(model: Transformer, p: int) -> Transformer:
    """``model`` for fp32 decoding on the CPU: a copy whose decoder matrices and generator are SplitLinears in ``p``
    blocks (torch's thread count), sharing every other module and parameter (the encoder, embeddings and
    LayerNorms); one more copy of the decoder's matrices and of the output table. A model already split is returned
    as it is."""
    if isinstance(model.generator, SplitLinear):
        return model
    fast = copy.copy(model)
    fast._modules = dict(model._modules)
    fast.decoder = copy.deepcopy(model.decoder, memo={id(t): t for t in model.decoder.parameters()})
    for layer in fast.decoder.layers:
        cross = layer.cross_attn
        cross.in_proj = SplitParts(cross.in_proj, p, (cross.query_rows, cross.key_value_rows))
    for module in list(fast.decoder.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.Linear):
                setattr(module, name, SplitLinear(child.weight, child.bias, p))
    fast.generator = SplitLinear(model.generator.weight, None, p)
    return fast
