"""The model as each precision decodes it: a copy in eval mode with modules swapped in for decoding steps, sharing the
weights it does not change. The step is always the model's own; the model the copy is made from is left as it is, in
its mode, its modules and its weights, whatever the copy then does.

bf16, fp16: the Linear weights cast once (autocast caches no casts under inference mode, so each step would cast
every weight again; cast ahead, autocast rounds the same weights the same way), the output table a copy of its own so
that embeddings stay fp32. int8: every Linear layer in int8 (model.linears.Int8Linear) but encoder-decoder attention's
query and output projections, which stay fp32 as the folded attention computes them. fp32: the model's own weights.
On a CPU, fp32 and int8 fold encoder-decoder attention into its float projections for batches of few sentences
(model.cross_fold), and every precision's copy calls its modules directly (model.speed.called_directly). Folded or
not, a step computes the same numbers but for the order of float sums, so a sentence's translation does not depend on
how many others share its batch.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from transformer.model.cross_fold import FoldedCrossAttention
from transformer.model.linears import Int8Linear, LinearParts, float_linear, swap_linears
from transformer.model.speed import called_directly
from transformer.model.transformer import Transformer
from transformer.runtime.precision import PRECISIONS


def decoding_model(model: Transformer, name: str, device: torch.device) -> Transformer:
    """``model`` as it decodes in precision ``name`` (transformer.runtime.precision) on ``device``: its
    ``precision_copy``, on a CPU with encoder-decoder attention folded in fp32 and int8, and called directly."""
    fast = precision_copy(model, name)
    if device.type == "cpu" and not PRECISIONS[name].mixed:
        fold_cross_attention(fast, model)
    if device.type == "cpu" or PRECISIONS[name].mixed:
        called_directly(fast)
    return fast


def precision_copy(model: Transformer, name: str) -> Transformer:
    """A copy of ``model``'s modules in eval mode with the Linear layers precision ``name`` decodes with; it shares
    every tensor it does not change."""
    p = PRECISIONS[name]
    if p.mixed:
        half = copy.deepcopy(model).eval().requires_grad_(False)
        half.generator.weight = nn.Parameter(half.generator.weight.detach().to(p.dtype), requires_grad=False)
        swap_linears(half, lambda parent, linear: linear.to(p.dtype))
        return half
    if p.trains:  # fp32: new modules over the model's own tensors
        return copy.deepcopy(model, memo={id(t): t for t in (*model.parameters(), *model.buffers())}).eval()
    q = copy.deepcopy(model).eval().requires_grad_(False)
    crosses = [layer.cross_attn for layer in q.decoder.layers]
    swap_linears(q, lambda parent, linear: linear if parent in crosses else Int8Linear(linear.weight, linear.bias))
    for cross in crosses:  # its queries in fp32 (as folded: model.cross_fold), its keys and values in int8
        parts = [(cross.query_rows, float_linear), (cross.key_value_rows, Int8Linear)]
        cross.in_proj = LinearParts(cross.in_proj, parts)
    return q.eval()


def fold_cross_attention(fast: Transformer, model: Transformer) -> None:
    """Swap folded encoder-decoder attention (model.cross_fold) into the decoder of ``fast``, a copy of ``model``,
    folded from ``model``'s float weights."""
    for layer, source in zip(fast.decoder.layers, model.decoder.layers):
        layer.cross_attn = FoldedCrossAttention(layer.cross_attn, source.cross_attn)
