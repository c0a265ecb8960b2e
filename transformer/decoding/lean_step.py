"""The decoder's incremental step as straight-line tensor code over the model's own layers, for decoding on the CPU.

``Transformer.decode_step`` runs the paper's modules: sub-layer wrappers, dropout (the identity in eval mode),
attention that splits and merges heads for any number of positions. At a decoding step's few rows, calling
those pieces costs more than their arithmetic. ``LeanDecoding.decode_step`` computes the same values from the
same layers (each matrix through the layer's own linear map: nn.Linear, ``StepLinear`` or ``Int8Linear``), for
one position, with one call per operation. Eval mode only, as search runs it: no dropout is applied. Given a model
with float weights to ``fold`` from (the model itself, or the original of an int8 copy), a batch of few sentences gets
its cross-attention folded into those projections (decoding.cross_fold).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.decoding import cross_fold
from transformer.decoding.cross_fold import FoldedState
from transformer.model.decoder_state import DecoderState
from transformer.model.transformer import DecoderLayer, Transformer

Map = Callable[[Tensor], Tensor]


def layer_norm(norm: nn.Module) -> Map:
    """A LayerNorm's forward with its parameters looked up once (an Identity's as it is)."""
    if not isinstance(norm, nn.LayerNorm):
        return norm.forward
    shape, weight, bias, eps = norm.normalized_shape, norm.weight, norm.bias, norm.eps
    return lambda x: F.layer_norm(x, shape, weight, bias, eps)


class LeanLayer:
    """One decoder layer's step on rows [R, d_model], through the layer's own maps and norms; ``fold_from``: the layer
    as trained, whose float cross-attention weights folding uses (this one, or the original of a copy)."""

    def __init__(self, layer: DecoderLayer, fold_from: DecoderLayer | None = None) -> None:
        self_attn, cross = layer.self_attn, layer.cross_attn
        self.h, self.d_k = self_attn.h, self_attn.d_k
        self.qkv: Map = self_attn.in_proj.forward
        self.self_out: Map = self_attn.out_proj.forward
        self.cross_q: Map = partial(cross.in_proj.part, rows=cross.query_rows)
        self.cross_out: Map = cross.out_proj.forward
        self.fold_from = None if fold_from is None else fold_from.cross_attn
        self.fold_weights = None if self.fold_from is None else cross_fold.fold_weights(self.fold_from)
        self.w_1: Map = layer.ff.w_1.forward
        self.w_2: Map = layer.ff.w_2.forward
        self.norms: list[Map] = [layer_norm(norm) for norm in layer.norms]
        self.norm_first = layer.norm_first

    def sublayer(self, x: Tensor, i: int, f: Map) -> Tensor:
        """Layer.sublayer without its dropout."""
        if self.norm_first:
            return x + f(self.norms[i](x))
        return self.norms[i](x + f(x))

    def fold(self, kv: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
        """This layer's folded cross-attention (cross_fold.fold) from its K and V [n, 2, h, S, d_k]."""
        return cross_fold.fold(kv, keep, *self.fold_weights)

    def step(
        self, y: Tensor, cache: Tensor, t: int, cross: Tensor, mask: Tensor, beam: int, folded: bool = False
    ) -> Tensor:
        """DecoderLayer.step for rows y [R, d_model] (its y [R, 1, d_model]); ``folded``: cross and mask are this
        layer's folded cross-attention and its score bias (cross_fold.fold)."""
        R, h, d_k = y.size(0), self.h, self.d_k

        def self_attend(z: Tensor) -> Tensor:
            qkv = self.qkv(z).view(R, 3, h, 1, d_k)
            cache[:, :, :, t] = qkv[:, 1:, :, 0]
            out = F.scaled_dot_product_attention(qkv[:, 0], cache[:, 0, :, : t + 1], cache[:, 1, :, : t + 1])
            return self.self_out(out.reshape(R, h * d_k))  # one query: [R, h, 1, d_k] is already [R, 1, h, d_k]

        def cross_attend(z: Tensor) -> Tensor:
            q = self.cross_q(z).view(-1, beam, h, d_k).transpose(1, 2)  # a sentence's beams as its queries
            out = F.scaled_dot_product_attention(q, cross[:, 0], cross[:, 1], mask)
            return self.cross_out(out.transpose(1, 2).reshape(R, h * d_k))

        def folded_attend(z: Tensor) -> Tensor:
            return cross_fold.attend(z, cross, mask, self.fold_from.out_proj.bias, h, beam)

        y = self.sublayer(y, 0, self_attend)
        y = self.sublayer(y, 1, folded_attend if folded else cross_attend)
        return self.sublayer(y, 2, lambda z: self.w_2(F.relu(self.w_1(z))))


class LeanDecoding(nn.Module):
    """``model`` for search (``pad_id``, ``encode``, ``start_state``, ``decode_step``), its step made lean; with
    ``fold``, the model as trained (``model`` itself, or the original of a copy laid out for decoding or in int8),
    cross-attention is folded into its float projections for batches where that reads less."""

    def __init__(self, model: Transformer, fold: Transformer | None = None) -> None:
        super().__init__()
        self.model = model
        self.fold = fold is not None
        self.pad_id = model.pad_id
        self.encode = model.encode
        sources = [None] * len(model.decoder.layers) if fold is None else list(fold.decoder.layers)
        self.layers = [LeanLayer(layer, source) for layer, source in zip(model.decoder.layers, sources)]
        self.final_norm: Map = layer_norm(model.decoder.norm)
        self.generator: Map = model.generator.forward
        self.train(model.training)

    def start_state(self, memory: Tensor, src_keep: Tensor) -> DecoderState:
        """Transformer.start_state, its cross-attention folded when ``fold`` and ``cross_fold.worth_folding``."""
        state = self.model.start_state(memory, src_keep)
        n, _, _, h, S, d_k = state.cross_kv.shape
        if not self.fold or not cross_fold.worth_folding(n, S, h, h * d_k):
            return state
        parts = [layer.fold(state.cross_kv[:, i], state.src_mask) for i, layer in enumerate(self.layers)]
        return FoldedState(state, torch.stack([ab for ab, _ in parts], 1), torch.stack([b for _, b in parts], 1))

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Transformer.decode_step: the next position's logits [R, V]; appends to the state's cache."""
        m, t = self.model, state.length
        state.reserve(t + 1)
        y = F.embedding(tokens, m.tgt_embed.weight) * m.scale + m.positions.at(t, 1)
        folded = isinstance(state, FoldedState)
        for i, layer in enumerate(self.layers):
            mask = state.src_mask[:, i] if folded else state.src_mask
            y = layer.step(y, state.self_kv[:, i], t, state.cross_kv[:, i], mask, state.beam, folded)
        state.length = t + 1
        return self.generator(self.final_norm(y))
