"""The peer: Hugging Face transformers' MarianMTModel built to tfm's shape, vocabulary and special tokens.

Same shape as a tfm ModelConfig (ReLU, sinusoidal positions, post-norm, tied embeddings,
embeddings scaled by sqrt(d_model)), same token ids (<PAD> 0, <START> 1, <END> 2), so both
models eat the same batches. Needs `pip install transformers` (a bench-only dependency).
"""

from __future__ import annotations

import torch
from transformers import MarianConfig, MarianMTModel

from transformer.config import ModelConfig
from transformer.export.marian import marian_config
from transformer.text.tokenizer import Tokenizer


def build_marian(model: ModelConfig, tokenizer: Tokenizer, max_positions: int = 512) -> MarianMTModel:
    """A randomly initialised MarianMTModel of the same shape as ``model``."""
    cfg = MarianConfig(**{**marian_config(model, tokenizer), "max_position_embeddings": max_positions})
    return MarianMTModel(cfg)


def marian_logits(peer: MarianMTModel, src: torch.Tensor, tgt_in: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Teacher-forced logits [B, T, V], as tfm's ``model(src, tgt_in)``."""
    out = peer(
        input_ids=src,
        attention_mask=(src != pad_id).long(),
        decoder_input_ids=tgt_in,
        decoder_attention_mask=(tgt_in != pad_id).long(),
    )
    return out.logits


def _copy_attention(dst, src) -> None:
    """tfm's stacked in_proj [W_Q; W_K; W_V] onto Marian's q_proj, k_proj, v_proj; out_proj as is."""
    for proj, w, b in zip((dst.q_proj, dst.k_proj, dst.v_proj), src.in_proj.weight.chunk(3), src.in_proj.bias.chunk(3)):
        proj.weight.copy_(w)
        proj.bias.copy_(b)
    dst.out_proj.load_state_dict(src.out_proj.state_dict())


def copy_tfm_weights(peer: MarianMTModel, model: torch.nn.Module) -> MarianMTModel:
    """Load a post-norm tfm Transformer's weights into ``peer`` so that both compute the same function.

    Marian's sinusoids put sin and cos in two halves where tfm interleaves them, so tfm's own table
    replaces Marian's (the positions of both encoder and decoder).
    """
    m = peer.model
    with torch.no_grad():
        m.shared.weight.copy_(model.src_embed.weight)
        m.decoder.embed_tokens.weight.copy_(model.tgt_embed.weight)
        peer.lm_head.weight.copy_(model.generator.weight)
        peer.final_logits_bias.zero_()
        for side in (m.encoder, m.decoder):
            n = side.embed_positions.weight.size(0)
            side.embed_positions.weight.copy_(model.positions.at(0, n))  # past a short table, computed
        for dst, src in zip(m.encoder.layers, model.encoder.layers):
            _copy_attention(dst.self_attn, src.self_attn)
            dst.self_attn_layer_norm.load_state_dict(src.norms[0].state_dict())
            dst.fc1.load_state_dict(src.ff.w_1.state_dict())
            dst.fc2.load_state_dict(src.ff.w_2.state_dict())
            dst.final_layer_norm.load_state_dict(src.norms[1].state_dict())
        for dst, src in zip(m.decoder.layers, model.decoder.layers):
            _copy_attention(dst.self_attn, src.self_attn)
            dst.self_attn_layer_norm.load_state_dict(src.norms[0].state_dict())
            _copy_attention(dst.encoder_attn, src.cross_attn)
            dst.encoder_attn_layer_norm.load_state_dict(src.norms[1].state_dict())
            dst.fc1.load_state_dict(src.ff.w_1.state_dict())
            dst.fc2.load_state_dict(src.ff.w_2.state_dict())
            dst.final_layer_norm.load_state_dict(src.norms[2].state_dict())
    return peer
