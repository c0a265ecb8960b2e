"""Scoring given translations (forced decoding): a translation tfm produced scores what translate printed for it, for
one model and an ensemble, greedy and beam; a forced prefix starts every hypothesis, and beam search after it is the
search started from it by hand."""

from __future__ import annotations

import pytest
import torch

from transformer import checkpoint
from transformer.decoding.forced import forced_scores
from transformer.decoding.search import Beam, _decode, beam_search, ranked
from transformer.decoding.translator import TranslateOptions, Translator

LINES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch.", "Der Hund."]


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("ensemble", [False, True])
def test_scoring_tfms_own_translations_gives_the_scores_it_printed(tiny_run, beam, ensemble):
    """Every hypothesis of the n-best, fed back through the same step: the score the search gave it (and the
    Translator's score of a text that reads back as the search's tokens)."""
    paths = [tiny_run.run_dir / "best", tiny_run.run_dir / "checkpoints" / "step_3"][: 2 if ensemble else 1]
    t = Translator.from_checkpoint(paths, TranslateOptions("cpu", beam=beam, nbest=beam, alpha=1.0))
    tok = t.tokenizer
    ids, hyps = t._hypotheses(LINES, 1, t._search)
    for source, hs in zip(ids, hyps):
        src = torch.tensor([source + [tok.end_id]])
        scored = forced_scores(t.model, src.expand(len(hs), -1), [h.tokens for h in hs], tok.start_id, tok.end_id, 1.0)
        assert [s.score for s in scored] == pytest.approx([h.score for h in hs], abs=1e-4)
        assert all(len(s.token_log_probs) == len(s.tokens) + 1 for s in scored)
    readable = [(line, h) for line, hs in zip(LINES, hyps) for h in hs if tok.encode(tok.decode(h.tokens)) == h.tokens]
    if readable:
        scored = t.score([line for line, _ in readable], [tok.decode(h.tokens) for _, h in readable])
        assert [s.score for s in scored] == pytest.approx([h.score for _, h in readable], abs=1e-4)


def test_a_forced_prefix_starts_every_hypothesis_and_the_search_goes_on_as_from_it(tiny_run):
    loaded = checkpoint.load(tiny_run.run_dir / "best")
    tok, model = loaded.tokenizer, loaded.model.eval()
    t = Translator.from_checkpoint(loaded, TranslateOptions("cpu", beam=3, nbest=3, alpha=0.0))
    prefix = "A man"
    ids = tok.encode(prefix)
    for translation in t.translate_chunk(LINES, prefixes=[prefix] * len(LINES)):
        assert all(text.startswith(prefix) for text in translation.texts)
    # by hand: beam search from the prefix's state is the forced search's continuation, scores included
    src = torch.tensor([tok.encode(LINES[0]) + [tok.end_id]])
    forced = beam_search(model, src, tok.start_id, tok.end_id, 3, 0.0, 3, 1.0, 8, prefixes=[ids])[0]
    by_hand = _by_hand(model, src, ids, tok)
    assert [h.tokens for h in forced] == [h.tokens for h in by_hand]
    assert [h.score for h in forced] == pytest.approx([h.score for h in by_hand], abs=1e-4)


def _by_hand(model, src, prefix, tok):
    """Beam search of width 3 whose first steps are the prefix: the decoder state advanced through the prefix's
    tokens by hand, then the search's loop from there (its own model, whose encode returns the state reached)."""

    class FromPrefix(torch.nn.Module):
        pad_id = model.pad_id

        def encode(self, s):
            return model.encode(s)

        def start_state(self, memory, keep):
            state = model.start_state(memory, keep)
            self.before = 0.0
            for token, nxt in zip([tok.start_id, *prefix[:-1]], prefix):
                lprobs = model.decode_step(torch.tensor([token]), state).float().log_softmax(-1)
                self.before += float(lprobs[0, nxt])
            self.first = True
            return state

        def decode_step(self, tokens, state):
            if self.first:  # the search's <START> stands for the prefix's last token
                self.first = False
                tokens = torch.full_like(tokens, prefix[-1])
            return model.decode_step(tokens, state)

    hand = FromPrefix()
    limit = 8 - len(prefix)
    finished = _decode(hand, src, tok.start_id, tok.end_id, Beam(3), 1.0, limit, (3, 0.0))[0]
    full = [type(h)(prefix + h.tokens, 0.0, h.log_prob + hand.before, h.positional_scores) for h in finished]
    return ranked(full, 0.0)[:3]
