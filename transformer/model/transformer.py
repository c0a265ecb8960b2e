"""The Transformer of "Attention Is All You Need": embeddings, positions, attention, layers, the model.

Mask convention for the whole code base: a mask is a bool tensor, True = may attend (the convention
of ``torch.nn.functional.scaled_dot_product_attention``), broadcastable to [B, h, T_query, T_key].
The source padding mask is ``src_keep`` of shape [B, 1, 1, S]. Decoder self-attention needs only the
causal mask: right-padded target positions come after every real one, so no real position sees them,
and the loss ignores the padded positions themselves. A query with no key to attend to (a source of
nothing but <PAD>) gets an attention output of zeros, never NaN, in every precision.

Shapes: B batch, S source length, T target length, V vocabulary, h heads, d_k = d_model / h.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.config import ModelConfig
from transformer.model.decoder_state import DecoderState
from transformer.model.linears import output_rows
from transformer.model.speed import Dropout, attention_kernel


def sinusoids(start: int, length: int, d_model: int) -> Tensor:
    """Positional encodings of positions start..start+length-1: sin on even, cos on odd dimensions."""
    pos = torch.arange(start, start + length, dtype=torch.float64, device="cpu").unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu")
    inv_freq = torch.exp(two_i * (-math.log(10000.0) / d_model))
    pe = torch.empty(length, d_model, dtype=torch.float64, device="cpu")
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)
    return pe.float()


class PositionalEncoding(nn.Module):
    """Adds fixed sinusoidal positions; any length works, max_positions only sizes the precomputed table."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoids(0, max_positions, d_model), persistent=False)

    def at(self, start: int, length: int) -> Tensor:
        """The encodings of positions start..start+length-1 [length, d_model]: the table's, or computed past it."""
        if start + length <= self.table.size(0):
            return self.table[start : start + length]
        return sinusoids(start, length, self.d_model).to(self.table)


def safe_mask(keep: Tensor) -> tuple[Tensor, Tensor]:
    """(mask, rows): rows with no key to attend to may attend to all keys, and rows marks which rows had one."""
    if keep.dtype != torch.bool:
        raise TypeError(f"masks are bool (True = may attend), got {keep.dtype}")
    rows = keep.any(-1, keepdim=True)
    return keep | ~rows, rows


def attention_probs(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, rows: Tensor | None) -> Tensor:
    """Attention probabilities softmax(q k^T / sqrt(d_k)) under the same masks as SDPA, computed explicitly."""
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))
    if is_causal:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1)
    return probs if rows is None else probs * rows


class StackedLinear(nn.Linear):
    """Linear maps stacked along the output, as W^Q, W^K, W^V are in nn.MultiheadAttention; ``part`` applies some."""

    def part(self, x: Tensor, rows: slice) -> Tensor:
        """x through the stacked maps' output rows ``rows`` alone."""
        return F.linear(x, self.weight[rows], self.bias[rows])


class MultiHeadAttention(nn.Module):
    """Multi-head attention of ``h`` heads over ``d_model``: projections and head split/merge here, the attention itself
    in SDPA. ``attention_dropout`` drops attention probabilities while training (Tensor2Tensor's; the paper has none).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_model, self.h, self.d_k = cfg.d_model, cfg.h, cfg.d_model // cfg.h
        self.dropout = cfg.attention_dropout
        self.query_rows, self.key_value_rows = slice(0, d_model), slice(d_model, 3 * d_model)
        self.in_proj = StackedLinear(d_model, 3 * d_model)  # W^Q, W^K, W^V
        self.out_proj = nn.Linear(d_model, d_model)  # W^O
        self.record_weights = False
        self.weights: Tensor | None = None

    def _heads(self, x: Tensor, n: int) -> Tensor:
        """[B, T, n * d_model] -> [n, B, h, T, d_k]."""
        B, T, _ = x.shape
        return x.view(B, T, n, self.h, self.d_k).permute(2, 0, 3, 1, 4)

    def qkv(self, x: Tensor) -> Tensor:
        """Self-attention projections in one matmul: [3, B, h, T, d_k]."""
        return self._heads(self.in_proj(x), 3)

    def q(self, x: Tensor) -> Tensor:
        """Query projection for cross-attention: [B, h, T, d_k]."""
        return self._heads(self.in_proj.part(x, self.query_rows), 1)[0]

    def kv(self, memory: Tensor) -> Tensor:
        """Key and value projections of the encoder output for cross-attention: [2, B, h, S, d_k]."""
        return self._heads(self.in_proj.part(memory, self.key_value_rows), 2)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        rows: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """SDPA over the heads, merge them and project; rows (from safe_mask) zeroes queries with no key."""
        with attention_kernel(q):
            p = self.dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
        if self.record_weights:
            self.weights = attention_probs(q, k, mask, is_causal, rows)
        if rows is not None:
            out = out * rows
        B, _, T, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.h * self.d_k))

    def memory_state(self, memory: Tensor, mask: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
        """What ``cross_step`` reads of the encoder output memory [n, S, d_model], once per sentence: K and V [n, 2, h,
        S, d_k], V zero for a source of only <PAD> (rows, from safe_mask) so that its output is zero as in training;
        and the mask."""
        kv = self.kv(memory).transpose(0, 1)
        kv[:, 1].mul_(rows.view(-1, 1, 1, 1))
        return kv, mask

    def self_step(self, x: Tensor, cache: Tensor, t: int) -> Tensor:
        """Masked self-attention of one new position per row, x [R, d_model]: its K and V go into cache
        [R, 2, h, capacity, d_k] at t, and its query attends to positions 0..t, all of them before it (no mask)."""
        R = x.size(0)
        qkv = self.in_proj(x).view(R, 3, self.h, 1, self.d_k)
        cache[:, :, :, t] = qkv[:, 1:, :, 0]
        k, v = cache[:, 0, :, : t + 1], cache[:, 1, :, : t + 1]
        out = F.scaled_dot_product_attention(qkv[:, 0], k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.reshape(R, self.h * self.d_k))  # one query: [R, h, 1, d_k] is [R, 1, h, d_k]

    def cross_step(self, x: Tensor, kv: Tensor, mask: Tensor) -> Tensor:
        """Encoder-decoder attention of rows x [R, d_model] to kv [n, 2, h, S, d_k], one entry per sentence: a
        sentence's R / n consecutive rows (its beams) attend to it together, as that sentence's queries."""
        R, n = x.size(0), kv.size(0)
        q = self.in_proj.part(x, self.query_rows).view(n, R // n, self.h, self.d_k).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, kv[:, 0], kv[:, 1], mask, dropout_p=p)
        return self.out_proj(out.transpose(1, 2).reshape(R, self.h * self.d_k))


class FeedForward(nn.Module):
    """Position-wise feed-forward network: max(0, x W_1 + b_1) W_2 + b_2, from d_model to d_ff and back.

    ``relu_dropout`` drops the ReLU's output while training (Tensor2Tensor's; the paper has none).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w_2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.dropout = Dropout(cfg.relu_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.dropout(F.relu(self.w_1(x))))


class Layer(nn.Module):
    """Shared by encoder and decoder layers: residual connection, dropout and LayerNorm around each of its
    ``n_norms`` sub-layers. ``dropout`` is the paper's, on each sub-layer's output; post-norm as in the paper, or
    pre-norm with ``norm_first``."""

    def __init__(self, cfg: ModelConfig, n_norms: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.ff = FeedForward(cfg)
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.d_model) for _ in range(n_norms))
        self.dropout = Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def sublayer(self, x: Tensor, norm: nn.Module, f: Callable[[Tensor], Tensor]) -> Tensor:
        """Post-norm LayerNorm(x + Dropout(f(x))) as in the paper, or pre-norm x + Dropout(f(LayerNorm(x)))."""
        if self.norm_first:
            return x + self.dropout(f(norm(x)))
        return norm(x + self.dropout(f(x)))


class EncoderLayer(Layer):
    """Self-attention over the source, then the feed-forward network."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 2)

    def forward(self, x: Tensor, mask: Tensor | None, rows: Tensor | None) -> Tensor:
        norm_1, norm_2 = self.norms
        x = self.sublayer(x, norm_1, lambda y: self.self_attn.attend(*self.self_attn.qkv(y), mask=mask, rows=rows))
        return self.sublayer(x, norm_2, self.ff)


class DecoderLayer(Layer):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 3)
        self.cross_attn = MultiHeadAttention(cfg)

    def forward(self, y: Tensor, memory: Tensor, mask: Tensor | None, rows: Tensor | None) -> Tensor:
        """All target positions at once, causal self-attention through SDPA's is_causal (fast kernels)."""
        norm_1, norm_2, norm_3 = self.norms
        y = self.sublayer(y, norm_1, lambda z: self.self_attn.attend(*self.self_attn.qkv(z), is_causal=True))
        y = self.sublayer(
            y,
            norm_2,
            lambda z: self.cross_attn.attend(self.cross_attn.q(z), *self.cross_attn.kv(memory), mask=mask, rows=rows),
        )
        return self.sublayer(y, norm_3, self.ff)

    def step(self, y: Tensor, cache: Tensor, t: int, cross: Tensor, mask: Tensor) -> Tensor:
        """Target position t alone, for rows y [R, d_model]: self-attention through the cache [R, 2, h, capacity,
        d_k], encoder-decoder attention to cross and mask, one entry per sentence (MultiHeadAttention.memory_state)."""
        norm_1, norm_2, norm_3 = self.norms
        y = self.sublayer(y, norm_1, lambda z: self.self_attn.self_step(z, cache, t))
        y = self.sublayer(y, norm_2, lambda z: self.cross_attn.cross_step(z, cross, mask))
        return self.sublayer(y, norm_3, self.ff)


class Encoder(nn.Module):
    """N encoder layers (or ``encoder_layers``), plus a final LayerNorm when pre-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.depths[0]))
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()

    def forward(self, x: Tensor, src_keep: Tensor) -> Tensor:
        mask, rows = safe_mask(src_keep)
        for layer in self.layers:
            x = layer(x, mask, rows)
        return self.norm(x)


class Decoder(nn.Module):
    """N decoder layers (or ``decoder_layers``), plus a final LayerNorm when pre-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.depths[1]))
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()

    def forward(self, y: Tensor, memory: Tensor, src_keep: Tensor) -> Tensor:
        mask, rows = safe_mask(src_keep)
        for layer in self.layers:
            y = layer(y, memory, mask, rows)
        return self.norm(y)


class Transformer(nn.Module):
    """The encoder-decoder Transformer that ``cfg`` describes (the paper's base model by default), over one vocabulary
    of ``vocab_size`` tokens for both sides (two tables of it unless ``tie_embeddings``) whose ``pad_id`` is padding."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int):
        super().__init__()
        if cfg.d_model % cfg.h or cfg.d_model % 2:
            raise ValueError(f"d_model ({cfg.d_model}) must be even and divisible by h ({cfg.h})")
        self.pad_id = pad_id
        self.scale = math.sqrt(cfg.d_model)
        self.src_embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.tgt_embed = (
            self.src_embed if cfg.tie_embeddings else nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        )
        self.positions = PositionalEncoding(cfg.d_model, cfg.max_positions)
        self.dropout = Dropout(cfg.dropout)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.generator = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.generator.weight = self.src_embed.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights, zero biases, N(0, d_model^-0.5) embeddings with a zero <PAD> row."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for embed in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embed.weight, std=self.scale**-1)
            with torch.no_grad():
                embed.weight[self.pad_id].zero_()

    def embed(self, tokens: Tensor, table: nn.Embedding, start: int = 0) -> Tensor:
        """Token embeddings of tokens [B, T] scaled by sqrt(d_model), plus positions start..start+T-1, then dropout."""
        return self.dropout(table(tokens) * self.scale + self.positions.at(start, tokens.size(1)))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S] -> (memory [B, S, d_model], src_keep [B, 1, 1, S])."""
        src_keep = (src != self.pad_id)[:, None, None, :]
        return self.encoder(self.embed(src, self.src_embed), src_keep), src_keep

    def decode(self, tgt_in: Tensor, memory: Tensor, src_keep: Tensor, logits: bool = True) -> Tensor:
        """Teacher-forced logits [B, T, V] for every target position at once (the generator's input if not logits)."""
        y = self.decoder(self.embed(tgt_in, self.tgt_embed), memory, src_keep)
        return self.generator(y) if logits else y

    def forward(self, src: Tensor, tgt_in: Tensor, logits: bool = True) -> Tensor:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V], in one pass.

        With logits=False: the decoder's output [B, T, d_model], for training's fused generator_loss.
        """
        return self.decode(tgt_in, *self.encode(src), logits=logits)

    def start_state(self, memory: Tensor, src_keep: Tensor, vocab: Tensor | None = None) -> DecoderState:
        """A fresh incremental state with one row per sentence; what each layer's encoder-decoder attention reads of
        the source is computed here, once. With ``vocab`` (target ids: a shortlist's), its steps score those alone."""
        mask, rows = safe_mask(src_keep)
        layers = self.decoder.layers
        cross = [layer.cross_attn.memory_state(memory, mask, rows) for layer in layers]
        h, d_k = layers[0].self_attn.h, layers[0].self_attn.d_k
        state = DecoderState(torch.stack([kv for kv, _ in cross], 1), torch.stack([m for _, m in cross], 1), h, d_k)
        if vocab is not None:
            state.output = output_rows(self.generator, vocab, memory.size(0))
        return state

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """The next position's logits [R, V] given its input tokens [R]; appends to the state's cache. A state with a
        vocabulary of its own (a shortlist's ids, ascending) gives the logits of those alone, [R, len(ids)]: the
        search picks among them and maps its picks back to ids, with no pass over the whole vocabulary."""
        t = state.length
        state.reserve(t + 1)
        y = self.embed(tokens[:, None], self.tgt_embed, t)[:, 0]
        for i, layer in enumerate(self.decoder.layers):
            y = layer.step(y, state.self_kv[:, i], t, state.cross[:, i], state.cross_mask[:, i])
        state.length = t + 1
        y = self.decoder.norm(y)
        return self.generator(y) if state.output is None else state.output(y)

    def attention_weights(self, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
        """Attention probabilities for heatmaps: 'encoder', 'decoder', 'cross' -> per layer [B, h, T_q, T_k]."""
        groups = {
            "encoder": [layer.self_attn for layer in self.encoder.layers],
            "decoder": [layer.self_attn for layer in self.decoder.layers],
            "cross": [layer.cross_attn for layer in self.decoder.layers],
        }
        modules = [m for group in groups.values() for m in group]
        for m in modules:
            m.record_weights = True
        try:
            with torch.no_grad():
                self(src, tgt_in)
            return {name: [m.weights for m in group] for name, group in groups.items()}
        finally:
            for m in modules:
                m.record_weights, m.weights = False, None
