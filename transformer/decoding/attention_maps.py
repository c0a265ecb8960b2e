"""The attention of one translated sentence, for heatmaps (``tfm attention``, the server's page): the sentence is
translated greedily, then its translation is fed back teacher-forced with the attention probabilities recorded."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer.decoding.search import greedy_search
from transformer.decoding.translator import source_line
from transformer.errors import PlotError
from transformer.model.decoding_copy import precision_copy
from transformer.model.transformer import Transformer
from transformer.text.batching import source_tensor
from transformer.text.tokenizer import Tokenizer

ATTENTION_KINDS = ("cross", "encoder", "decoder")


@dataclass
class AttentionMaps:
    """One sentence's attention probabilities in one layer: weights [h, rows, cols] and the tokens on each axis."""

    kind: str
    layer: int
    weights: torch.Tensor
    rows: list[str]
    cols: list[str]
    translation: str


def _names(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.id_to_token(i) or "?" for i in ids]


def attention_maps(
    model: Transformer,
    tokenizer: Tokenizer,
    sentence: str,
    kind: str = "cross",
    layer: int = -1,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    lowercase: bool = False,
    tag: int | None = None,
) -> AttentionMaps:
    """Translate ``sentence`` greedily, then return the attention of one layer (0-based; -1 = last) of ``kind``, in
    eval mode through a copy of the model's modules (its own modes and weights untouched).
    ``lowercase``: the model was trained on lowercased text, so the sentence is lowercased as the Translator does;
    ``tag``: a multilingual model's target tag, which starts the source (and is shown, labelled, as its first token).

    'cross' (encoder-decoder): rows are the target tokens produced, columns the source tokens (with
    <END>, as the model reads it). 'encoder': source by source. 'decoder': rows the tokens produced,
    columns the decoder's inputs (<START> and the tokens before).
    """
    if kind not in ATTENTION_KINDS:
        raise PlotError(f"attention kind '{kind}' unknown; choose one of {', '.join(ATTENTION_KINDS)}")
    n_layers = len(model.encoder.layers if kind == "encoder" else model.decoder.layers)
    if not -n_layers <= layer < n_layers:
        raise PlotError(f"layer {layer + 1} does not exist; the model has layers 1..{n_layers}")
    ids = tokenizer.encode(source_line(sentence, lowercase))
    if not ids:
        raise PlotError("the sentence is empty; give a sentence to translate")
    ids = ([] if tag is None else [tag]) + ids
    device = next(model.parameters()).device
    model = precision_copy(model, "fp32")  # in eval mode, whatever the model's own modes: theirs stay as they are
    src = source_tensor([ids], tokenizer).to(device)
    hyp = greedy_search(model, src, tokenizer.start_id, tokenizer.end_id, max_len_a, max_len_b)[0]
    tgt_in = torch.tensor([[tokenizer.start_id, *hyp.tokens]], device=device)
    weights = model.attention_weights(src, tgt_in)[kind][layer][0].float().cpu()
    src_tokens = _names(tokenizer, src[0].tolist())
    produced = _names(tokenizer, [*hyp.tokens, tokenizer.end_id])
    inputs = _names(tokenizer, tgt_in[0].tolist())
    rows, cols = {"cross": (produced, src_tokens), "encoder": (src_tokens, src_tokens), "decoder": (produced, inputs)}[
        kind
    ]
    return AttentionMaps(kind, layer % n_layers, weights, rows, cols, tokenizer.decode(hyp.tokens))
