"""A checkpoint as a CTranslate2 model (``tfm export --format ctranslate2``).

The CTranslate2 model is built with its Python spec API (``TransformerSpec.from_config``) and filled
tensor by tensor from tfm's state dict, so CTranslate2 runs exactly tfm's network: the same weights,
tfm's own sinusoid table (CTranslate2's default puts sin and cos in two halves, tfm interleaves them),
post- or pre-norm as the config says, tied embeddings, and tfm's token strings as vocabulary. tfm
feeds ``x + <END>`` as the source and starts the target with ``<START>``, so the exported config sets
``add_source_eos`` and ``decoder_start_token`` to match; give CTranslate2 the source tokens alone.
"""

from __future__ import annotations

import numpy as np
import torch

from transformer.checkpoint import Loaded
from transformer.errors import ExportError


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().contiguous().numpy()


def _linear(spec, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec, module: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(module.weight), _np(module.bias)


def _attention(spec, attn, norm: torch.nn.LayerNorm, self_attention: bool) -> None:
    """tfm's stacked in_proj is CTranslate2's fused [Q;K;V] (self) or Q then [K;V] (cross)."""
    w, b = attn.in_proj.weight, attn.in_proj.bias
    if self_attention:
        _linear(spec.linear[0], w, b)
    else:
        d = w.size(1)
        _linear(spec.linear[0], w[:d], b[:d])
        _linear(spec.linear[1], w[d:], b[d:])
    _linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)
    _norm(spec.layer_norm, norm)


def _ffn(spec, ff, norm: torch.nn.LayerNorm) -> None:
    _linear(spec.linear_0, ff.w_1.weight, ff.w_1.bias)
    _linear(spec.linear_1, ff.w_2.weight, ff.w_2.bias)
    _norm(spec.layer_norm, norm)


def ctranslate2_spec(loaded: Loaded):  # -> ctranslate2.specs.TransformerSpec (an optional import)
    """A ctranslate2 TransformerSpec holding the checkpoint's weights and vocabulary."""
    try:
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise ExportError(
            "export --format ctranslate2 needs the ctranslate2 package; pip install ctranslate2"
        ) from None

    m, cfg, tok = loaded.model, loaded.cfg.model, loaded.tokenizer
    spec = transformer_spec.TransformerSpec.from_config(
        cfg.depths, cfg.h, pre_norm=cfg.norm_first, activation=common_spec.Activation.RELU
    )
    table = _np(m.positions.table)
    for side, embed in ((spec.encoder, m.src_embed), (spec.decoder, m.tgt_embed)):
        embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings  # encoder: a list
        embeddings.weight = _np(embed.weight)
        side.position_encodings.encodings = table
        if cfg.norm_first:
            _norm(side.layer_norm, (m.encoder if side is spec.encoder else m.decoder).norm)
    for layer_spec, layer in zip(spec.encoder.layer, m.encoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, layer.norms[0], True)
        _ffn(layer_spec.ffn, layer.ff, layer.norms[1])
    for layer_spec, layer in zip(spec.decoder.layer, m.decoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, layer.norms[0], True)
        _attention(layer_spec.attention, layer.cross_attn, layer.norms[1], False)
        _ffn(layer_spec.ffn, layer.ff, layer.norms[2])
    _linear(spec.decoder.projection, m.generator.weight)
    vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = tok.UNK, tok.START, tok.END
    spec.config.decoder_start_token = tok.START
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = m.encoder.layers[0].norms[0].eps
    spec.validate()
    spec.optimize()  # stores the tied embedding once
    return spec
