"""Word alignments from attention (``tfm translate --align``): which source word each target word was translated from,
read from a layer's encoder-decoder attention. Attention-based, as fairseq's and Marian's are when no aligner was
trained: good where the model attends to what it translates (often a middle or last layer), not a trained aligner's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from transformer.text.batching import source_tensor
from transformer.text.tokenizer import Tokenizer


def word_of(tokenizer: Tokenizer, ids: Sequence[int]) -> list[int]:
    """The word (from 0) each token of ``ids`` belongs to: a piece that starts with ``▁`` starts a word, every other
    piece (a BPE continuation, a byte) belongs to the word before it."""
    words, word = [], -1
    for i in ids:
        piece = tokenizer.id_to_token(i) or ""
        if piece.startswith("▁") or word < 0:
            word += 1
        words.append(word)
    return words


def pharaoh(
    model: nn.Module, tokenizer: Tokenizer, source: Sequence[int], target: Sequence[int], layer: int, skip: int = 0
) -> str:
    """The alignment of one translation as Pharaoh ``i-j`` pairs (source word i, target word j, from 0), sorted by
    target word: each target token linked to the source token it attends to most in ``layer``'s encoder-decoder
    attention (the mean over heads), and both merged into words. ``source``: its token ids as the model read them,
    the first ``skip`` of which (a target tag) are never linked, nor is <END>."""
    if len(source) <= skip or not target:
        return ""
    device = next(model.parameters()).device
    src = source_tensor([list(source)], tokenizer).to(device)
    tgt_in = torch.tensor([[tokenizer.start_id, *target]], device=device)
    with torch.inference_mode():
        weights = model.attention_weights(src, tgt_in)["cross"][layer][0].float().mean(0)  # [T + 1, S + 1]
    chosen = (weights[: len(target), skip : len(source)].argmax(-1) + skip).tolist()
    src_words, tgt_words = word_of(tokenizer, source[skip:]), word_of(tokenizer, target)
    links = {(src_words[s - skip], tgt_words[j]) for j, s in enumerate(chosen)}
    return " ".join(f"{i}-{j}" for i, j in sorted(links, key=lambda p: (p[1], p[0])))
