"""Export a checkpoint as a Hugging Face MarianMTModel folder (``tfm export --format hf``).

Marian is tfm's post-norm network with the same sublayers, scaling and tied embeddings, but its sinusoids
put sin in the first half of the d_model dimensions and cos in the second where tfm interleaves them, and
``from_pretrained`` recomputes them, so a patched table would not survive a reload. The network is
invariant under one permutation applied to its whole residual stream, so every weight that reads or writes
that stream is permuted (tfm's even dimensions first, then the odd ones): Marian's own table is then tfm's
table in that order, and the exported model computes tfm's function with nothing patched. The folder is
written with ``transformers`` itself (``pip install transformers``) and loads with no tfm code installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from transformer.checkpoint import Loaded
from transformer.config import Config, ModelConfig
from transformer.errors import ExportError
from transformer.export.model_card import model_card
from transformer.text.tokenizer import TAG, Tokenizer


def residual_order(d_model: int) -> Tensor:
    """Marian's dimension m holds tfm's dimension ``order[m]``: tfm's sin (even) dimensions, then its cos (odd)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def check_exportable(cfg: Config) -> None:
    """Refuse, in one line, a model that Marian cannot compute exactly."""
    if cfg.model.norm_first:
        raise ExportError(
            "export --format hf: Marian has no pre-norm layers, so a model.norm_first: true checkpoint cannot be "
            "exported exactly; export it with --format ctranslate2, or train with model.norm_first: false"
        )
    if cfg.model.d_model % 2:
        raise ExportError(f"export --format hf: d_model {cfg.model.d_model} is odd; Marian's sinusoids need it even")


def marian_state_dict(model: torch.nn.Module, d_model: int, tied: bool) -> dict[str, Tensor]:
    """tfm's weights under Marian's names, each one that touches the residual stream permuted by residual_order."""
    order = residual_order(d_model)
    sd: dict[str, Tensor] = {}

    def reads(name: str, weight: Tensor, bias: Tensor | None = None) -> None:  # input side is the residual stream
        sd[f"{name}.weight"] = weight[:, order]
        if bias is not None:
            sd[f"{name}.bias"] = bias

    def writes(name: str, weight: Tensor, bias: Tensor) -> None:  # output side is the residual stream
        sd[f"{name}.weight"], sd[f"{name}.bias"] = weight[order], bias[order]

    def norm(name: str, ln: torch.nn.LayerNorm) -> None:
        sd[f"{name}.weight"], sd[f"{name}.bias"] = ln.weight[order], ln.bias[order]

    def attention(name: str, attn) -> None:
        for proj, w, b in zip(("q", "k", "v"), attn.in_proj.weight.chunk(3), attn.in_proj.bias.chunk(3)):
            reads(f"{name}.{proj}_proj", w, b)
        writes(f"{name}.out_proj", attn.out_proj.weight, attn.out_proj.bias)

    def feed_forward(name: str, ff) -> None:
        reads(f"{name}.fc1", ff.w_1.weight, ff.w_1.bias)
        writes(f"{name}.fc2", ff.w_2.weight, ff.w_2.bias)

    with torch.no_grad():
        reads("model.encoder.embed_tokens", model.src_embed.weight)
        reads("model.decoder.embed_tokens", model.tgt_embed.weight)
        if tied:  # Marian keeps one table, model.shared, for both sides
            sd["model.shared.weight"] = sd["model.encoder.embed_tokens.weight"]
        reads("lm_head", model.generator.weight)
        for i, layer in enumerate(model.encoder.layers):
            p = f"model.encoder.layers.{i}"
            attention(f"{p}.self_attn", layer.self_attn)
            norm(f"{p}.self_attn_layer_norm", layer.norms[0])
            feed_forward(p, layer.ff)
            norm(f"{p}.final_layer_norm", layer.norms[1])
        for i, layer in enumerate(model.decoder.layers):
            p = f"model.decoder.layers.{i}"
            attention(f"{p}.self_attn", layer.self_attn)
            norm(f"{p}.self_attn_layer_norm", layer.norms[0])
            attention(f"{p}.encoder_attn", layer.cross_attn)
            norm(f"{p}.encoder_attn_layer_norm", layer.norms[1])
            feed_forward(p, layer.ff)
            norm(f"{p}.final_layer_norm", layer.norms[2])
    return {k: v.detach().float().cpu().contiguous() for k, v in sd.items()}


def marian_config(m: ModelConfig, tok: Tokenizer) -> dict:
    """MarianConfig arguments for tfm's shape and token ids."""
    return dict(
        vocab_size=tok.vocab_size,
        decoder_vocab_size=tok.vocab_size,
        d_model=m.d_model,
        encoder_layers=m.depths[0],
        decoder_layers=m.depths[1],
        encoder_attention_heads=m.h,
        decoder_attention_heads=m.h,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        activation_function="relu",
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=m.relu_dropout,
        max_position_embeddings=m.max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=m.tie_embeddings,
        tie_word_embeddings=m.tie_embeddings,
        pad_token_id=tok.pad_id,
        bos_token_id=tok.start_id,
        eos_token_id=tok.end_id,
        decoder_start_token_id=tok.start_id,
        forced_eos_token_id=None,
    )


def generation_defaults(cfg: Config, tok: Tokenizer) -> dict:
    """GenerationConfig arguments: tfm's beam, <PAD> and <START> never generated, and a length limit.

    tfm stops a translation at max_len_a * source length + max_len_b tokens; transformers knows no limit that
    depends on the source, so the export caps every output at that rule for the longest training source
    (data.max_len tokens and its <END>), plus the <END> it generates, which keeps a model that repeats itself
    from running on to the position table's end.
    tfm's length penalty is GNMT's ((5 + len) / 6) ** alpha; transformers divides by len ** length_penalty, so no
    setting is exact. The export takes length_penalty = 2/3 alpha, where the two grow alike with the length
    (d log / d log len equal at 10 tokens, a typical sentence). With alpha 0 and length_penalty 0 the two beam
    searches rank by the same score.
    """
    return dict(
        num_beams=cfg.decode.beam,
        length_penalty=round(2 * cfg.decode.alpha / 3, 4),
        early_stopping=True,
        max_new_tokens=min(
            int(cfg.decode.max_len_a * (cfg.data.max_len + 1) + cfg.decode.max_len_b) + 1,
            cfg.model.max_positions - 1,
        ),
        suppress_tokens=[tok.pad_id, tok.start_id],
        bos_token_id=tok.start_id,
        eos_token_id=tok.end_id,
        pad_token_id=tok.pad_id,
        decoder_start_token_id=tok.start_id,
        forced_eos_token_id=None,
    )


def fast_tokenizer(tok: Tokenizer):  # -> transformers.PreTrainedTokenizerFast
    """tfm's own tokenizer.json with <END> appended to every encoded text, as tfm feeds its source. A multilingual
    model's target tags (``>>fr<<``) are read from the text, as OPUS-MT's models read them: tfm adds the tag itself
    and reads none from text, so in the export they are tokens matched in text rather than special ones."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tok.to_str())
    for added in spec.get("added_tokens", []):
        if TAG.fullmatch(added["content"]):
            added["special"] = False
    hf = HFTokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    hf.post_processor = TemplateProcessing(
        single=f"$A {tok.END}", pair=f"$A {tok.END} $B:1 {tok.END}:1", special_tokens=[(tok.END, tok.end_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=hf,
        bos_token=tok.START,
        eos_token=tok.END,
        pad_token=tok.PAD,
        unk_token=tok.UNK,
        split_special_tokens=True,  # a literal "<END>" in user text is text, as in tfm
        clean_up_tokenization_spaces=False,  # tfm's decoder alone detokenizes
    )


def _name_tokenizer_class(path: Path) -> None:
    """Name the tokenizer class as transformers 4 knows it (5 writes its new name, which 4 cannot load, and reads
    the old one as an alias)."""
    settings = json.loads(path.read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_hf(loaded: Loaded, folder: Path) -> None:
    """Write config.json, model.safetensors, generation_config.json, the tokenizer and README.md into ``folder``
    (a model that ``check_exportable`` accepts)."""
    try:
        from transformers import GenerationConfig, MarianConfig, MarianMTModel
        from transformers.utils.logging import disable_progress_bar
    except ImportError:
        raise ExportError("export --format hf needs the transformers package; pip install transformers") from None
    disable_progress_bar()
    cfg, tok = loaded.cfg, loaded.tokenizer
    marian = MarianMTModel(MarianConfig(**marian_config(cfg.model, tok)))
    missing, unexpected = marian.load_state_dict(
        marian_state_dict(loaded.model, cfg.model.d_model, cfg.model.tie_embeddings), strict=False
    )
    left = [k for k in missing if "embed_positions" not in k and k != "final_logits_bias"]
    if left or unexpected:
        raise ExportError(f"export --format hf: weights do not map onto Marian ({left or unexpected}); a tfm bug")
    with torch.no_grad():
        marian.final_logits_bias.zero_()
    marian.generation_config = GenerationConfig(**generation_defaults(cfg, tok))
    marian.save_pretrained(folder)
    fast_tokenizer(tok).save_pretrained(folder)
    _name_tokenizer_class(folder / "tokenizer_config.json")
    (folder / "README.md").write_text(model_card(loaded), encoding="utf-8")
