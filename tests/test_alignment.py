"""Word alignments from encoder-decoder attention: BPE pieces merged into the words they spell, and a model trained to
copy its input aligns each word to itself."""

from __future__ import annotations

import random

import torch

from transformer.config import ModelConfig
from transformer.decoding.alignment import pharaoh, word_of
from transformer.model.transformer import Transformer
from transformer.text.tokenizer import Tokenizer

WORDS = ["hund", "katze", "maus", "baum", "haus", "auto", "boot", "ball", "buch", "tisch", "stuhl", "fenster"]


def test_pieces_are_merged_into_the_words_they_spell():
    tok = Tokenizer.train(["ein hund läuft im park", "zwei katzen"] * 50, vocab_size=300)
    ids = tok.encode("ein unbekanntes Wort")
    words = word_of(tok, ids)
    assert words[0] == 0 and words[-1] == 2 and words == sorted(words)
    assert max(words) + 1 == len("ein unbekanntes Wort".split())


def test_a_model_trained_to_copy_aligns_each_word_to_itself():
    """One-token words, a small model taught to copy for a few hundred updates: the alignment of a new sentence is
    the diagonal."""
    rng = random.Random(0)
    tok = Tokenizer.train([" ".join(rng.sample(WORDS, 6)) for _ in range(200)], vocab_size=400, min_frequency=1)
    assert all(len(tok.encode(w)) == 1 for w in WORDS)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(N=1, d_model=64, d_ff=128, h=2, dropout=0.0), tok.vocab_size, tok.pad_id)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        batch = [[tok.encode(w)[0] for w in rng.sample(WORDS, 6)] for _ in range(32)]
        src = torch.tensor([b + [tok.end_id] for b in batch])
        tgt_in = torch.tensor([[tok.start_id, *b] for b in batch])
        tgt_out = torch.tensor([[*b, tok.end_id] for b in batch])
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    sentence = [tok.encode(w)[0] for w in ["boot", "hund", "tisch", "ball", "haus", "maus"]]
    assert pharaoh(model, tok, sentence, sentence, layer=-1) == " ".join(f"{i}-{i}" for i in range(6))
