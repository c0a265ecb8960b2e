"""Sampling, a choice over the search's one loop: each sentence's draws seeded by its own line (so the same at any batch
size), temperature near 0 and top-k 1 as greedy search, top-p 1 at temperature 1 the model's distribution."""

from __future__ import annotations

import pytest
import torch
from test_search import END, PAD, SRC, START, STEPS, FixedModel

from transformer.decoding.search import Sample, greedy_search, inverse_cdf, sample
from transformer.decoding.translator import TranslateOptions, Translator

LINES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest.", "Der Hund.", "Ein Kind."]


def _generators(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed * 100_000 + i) for i in range(n)]


def test_a_seed_gives_the_same_samples_at_batch_1_and_64(tiny_run):
    options = TranslateOptions("cpu", sample=True, nbest=2, seed=3, batch_tokens=100_000)
    t = Translator.from_checkpoint(tiny_run.run_dir / "best", options)
    lines = (LINES * 13)[:64]
    together = t.translate_chunk(lines)
    alone = [t.translate_chunk([line], first_line_no=i)[0] for i, line in enumerate(lines, 1)]
    assert [x.texts for x in together] == [x.texts for x in alone]
    for x, y in zip(together, alone):  # the same draws; float sums of other shapes differ in the last digits
        assert x.scores == pytest.approx(y.scores, abs=1e-4)
    other = Translator.from_checkpoint(tiny_run.run_dir / "best", TranslateOptions("cpu", sample=True, nbest=2, seed=4))
    assert [x.texts for x in other.translate_chunk(lines)] != [x.texts for x in together]


def test_temperature_near_zero_and_top_k_one_are_greedy_search(tiny_run):
    best = tiny_run.run_dir / "best"
    greedy = [t.best for t in Translator.from_checkpoint(best, TranslateOptions("cpu", beam=1)).translate(LINES)]
    for settings in ({"temperature": 1e-6}, {"top_k": 1, "temperature": 5.0}):
        t = Translator.from_checkpoint(best, TranslateOptions("cpu", sample=True, **settings))
        assert [x.best for x in t.translate(LINES)] == greedy


def test_top_p_one_at_temperature_one_draws_the_models_distribution():
    """Step 0 of FixedModel's table is END 0.1, A 0.6, B 0.3: 6,000 draws of the first token (each sentence its own
    generator) pass a chi-square test at the 0.1% level (2 degrees of freedom: 13.8), and top-p 0.5 keeps A alone."""
    n = 6000
    model = FixedModel(STEPS)
    src = SRC.expand(n, -1)
    hyps = sample(model, src, START, END, Sample(_generators(n), top_p=1.0), max_len_b=1)
    first = torch.tensor([h.tokens[0] if h.tokens else END for h in hyps])
    counts = torch.stack([(first == token).sum() for token in (END, 3, 4)]).double()
    expected = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64) * n
    assert ((counts - expected) ** 2 / expected).sum() < 13.8, counts
    narrow = sample(model, src[:200], START, END, Sample(_generators(200, 1), top_p=0.5), max_len_b=1)
    assert {h.tokens[0] for h in narrow} == {3}
    assert not any(PAD in h.tokens or START in h.tokens for h in hyps)
    greedy = greedy_search(model, SRC, START, END, max_len_b=1)[0]
    assert greedy.tokens == [3]


def test_a_token_of_probability_zero_is_never_drawn():
    """The uniform draw's ends: u = 0 names the first token with probability, and a u whose product with the total
    rounds up to it names the last one, never a token of probability 0 (<PAD> or <START> after the search bans them)."""
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    for u, want in ((0.0, [1, 2]), (0.25, [1, 2]), (0.5, [3, 2]), (1.0 - 2**-24, [3, 2]), (1.0, [3, 2])):
        assert inverse_cdf(probs, torch.full((2,), u)).squeeze(1).tolist() == want, u
