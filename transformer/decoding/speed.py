"""Code of the search and the Translator that exists only for speed, kept apart so that search.py reads as the
algorithm.

Each piece computes what the plain PyTorch call it stands for computes; ``python -m bench.levers`` measures them.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from transformer.model.transformer import Transformer


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


class TransposedGenerator(nn.Module):
    """The output projection x W^T with W^T kept contiguous ([d_model, V]) rather than W as stored ([V, d_model]).

    W is the embedding table (tied), laid out for embedding lookups. On the CPU, the matmul of a decoding
    step's few rows against the stored table takes a slower path than against its transpose made
    contiguous once; the product is the same up to float rounding.
    """

    def __init__(self, weight: Tensor):
        super().__init__()
        self.register_buffer("weight_t", weight.detach().t().contiguous(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight_t


def with_transposed_generator(model: Transformer) -> Transformer:
    """``model`` for fp32 decoding on the CPU: a shallow copy sharing every module and parameter but the generator,
    which is a TransposedGenerator of the same weight (one more copy of the output table, none of the rest)."""
    if isinstance(model.generator, TransposedGenerator):
        return model
    fast = copy.copy(model)
    fast._modules = dict(model._modules)
    fast.generator = TransposedGenerator(model.generator.weight)
    return fast
