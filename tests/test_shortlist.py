"""The lexical shortlist: counted from pairs as p(t | s) ranks them, a batch's tokens its sources' lists and the
frequent ones, decoding that scores those alone (as the whole vocabulary where they are all of it: exactly in fp32,
within the rounding of the listed rows' product in int8), and a file made for another tokenizer refused."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny import SAMPLE, tiny_config

from transformer.checkpoint import Loaded
from transformer.decoding.ensemble import Ensemble
from transformer.decoding.search import Hypothesis, Sample, beam_search, greedy_search, sample
from transformer.decoding.shortlist import Shortlist, Shortlisted
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.errors import ConfigError, DataError
from transformer.model.decoding_copy import decoding_model
from transformer.model.transformer import Transformer
from transformer.text.tokenizer import Tokenizer

LINES = ["Ein Mann fährt Fahrrad.", "Der Hund läuft im Park.", "Zwei Kinder spielen im Wasser."]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    texts = (SAMPLE / "train.de").read_text().splitlines() + (SAMPLE / "train.en").read_text().splitlines()
    return Tokenizer.train(texts, vocab_size=400)


@pytest.fixture(scope="module")
def loaded(tok: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    cfg = tiny_config(tmp_path_factory.mktemp("sl"), decode={"max_len_b": 6, "beam": 3})
    torch.manual_seed(0)
    return Loaded(cfg, tok, Transformer(cfg.model, tok.vocab_size, tok.pad_id), {}, cfg.out_dir)


def test_each_source_token_lists_the_targets_most_often_beside_it(tok: Tokenizer) -> None:
    a, b, x, y, z = (tok.encode(w)[0] for w in ("Mann", "Hund", "man", "dog", "bike"))
    pairs = [([a], [x, z])] * 3 + [([a], [y])] + [([b], [y])] * 2 + [([a, b], [x])] * 4
    shortlist = Shortlist.count(pairs, tok, per_token=2, frequent=0)
    assert shortlist.table[a].tolist() == [x, z] and shortlist.table[b].tolist() == [x, y]  # a: 7 x, 3 z; b: 4 x, 2 y
    assert sorted(shortlist.always.tolist()) == sorted({tok.pad_id, tok.start_id, tok.end_id, tok.unk_id})
    frequent = Shortlist.count(pairs, tok, per_token=2, frequent=1)
    assert x in frequent.always.tolist() and frequent.table[a].tolist() == [z, y]  # x is kept for every sentence
    src = torch.tensor([[a, tok.pad_id]])
    assert frequent.tokens(src, tok.pad_id, also=[b]).tolist() == sorted({*frequent.always.tolist(), z, y, b})


def test_a_shortlist_of_every_token_decodes_as_the_whole_vocabulary(tok: Tokenizer, loaded: Loaded) -> None:
    everything = Shortlist(torch.full((tok.vocab_size, 1), -1), torch.arange(tok.vocab_size), tok.fingerprint())
    src = torch.tensor([tok.encode(line) for line in LINES[:1]])
    for precision in ("fp32", "int8"):
        model = decoding_model(loaded.model, precision, torch.device("cpu"))
        restricted = Shortlisted(model, everything.tokens(src, tok.pad_id))
        for search in (greedy_search, beam_search):
            full = search(model, src, tok.start_id, tok.end_id)
            listed = search(restricted, src, tok.start_id, tok.end_id)
            if precision == "fp32":
                assert listed == full
            else:  # the listed rows' int8 product is scaled at one scale, then by each row's: within its rounding
                listed, full = _hypotheses(listed), _hypotheses(full)
                assert [h.tokens for h in listed] == [h.tokens for h in full]
                for h, want in zip(listed, full):
                    torch.testing.assert_close(h.positional_scores, want.positional_scores, rtol=1e-5, atol=1e-5)


def _hypotheses(found: list) -> list[Hypothesis]:
    """greedy_search's hypotheses, or beam_search's n-best lists flattened."""
    return [h for x in found for h in (x if isinstance(x, list) else [x])]


class _Masked(torch.nn.Module):
    """The whole vocabulary's steps with every token outside ``vocab`` at -inf: what scoring a shortlist means,
    written apart from the shortlisted steps' own logits over ``vocab`` alone."""

    def __init__(self, model: torch.nn.Module, vocab: torch.Tensor) -> None:
        super().__init__()
        self.model, self.pad_id, self.training = model, model.pad_id, model.training
        self.encode, self.start_state = model.encode, model.start_state
        self.outside = torch.ones(model.generator.out_features, dtype=torch.bool).index_fill_(0, vocab, False)

    def decode_step(self, tokens: torch.Tensor, state) -> torch.Tensor:
        return self.model.decode_step(tokens, state).masked_fill(self.outside, float("-inf"))


def test_shortlisted_steps_choose_as_the_whole_vocabulary_with_the_rest_at_minus_inf(tok: Tokenizer, loaded: Loaded):
    src = torch.tensor([tok.encode(line)[:4] for line in LINES])
    prefix = tok.encode("Ein Hund")[:2]
    vocab = torch.tensor(sorted({*range(0, tok.vocab_size, 3), tok.end_id, tok.pad_id, tok.start_id, *prefix}))
    model = decoding_model(loaded.model, "fp32", torch.device("cpu"))
    shortlisted, masked = Shortlisted(model, vocab), _Masked(model, vocab)
    for prefixes in (None, [prefix, [], prefix[:1]]):
        for search in (greedy_search, _beam, _drawn):
            got = _flat(search(shortlisted, src, tok.start_id, tok.end_id, prefixes=prefixes))
            want = _flat(search(masked, src, tok.start_id, tok.end_id, prefixes=prefixes))
            assert [h.tokens for h in got] == [h.tokens for h in want]
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
            assert all(set(h.tokens) <= set(vocab.tolist()) for h in got)


def _beam(*args, **kwargs) -> list:
    return beam_search(*args, beam=3, nbest=2, **kwargs)


def _drawn(*args, **kwargs) -> list:
    return sample(*args, Sample([torch.Generator().manual_seed(i) for i in range(3)]), **kwargs)


def _flat(found: list) -> list:
    """A search's hypotheses in one list: each sentence's one (greedy, sampling) or n-best (beam)."""
    return [h for hyps in found for h in (hyps if isinstance(hyps, list) else [hyps])]


def test_decoding_chooses_among_the_batch_tokens_alone(tok: Tokenizer, loaded: Loaded, tmp_path: Path) -> None:
    few = torch.tensor([tok.encode(w)[0] for w in ("man", "dog", "bike")])
    table = torch.full((tok.vocab_size, 1), -1)
    path = tmp_path / "few.safetensors"
    Shortlist(table, torch.cat([few, torch.tensor([tok.end_id])]), tok.fingerprint()).save(path)
    models = [loaded.model, Transformer(loaded.cfg.model, tok.vocab_size, tok.pad_id)]
    for precision in ("fp32", "int8", "bf16"):
        for members in (models[:1], models):
            given = [replace(loaded, model=m) for m in members]
            t = Translator.from_checkpoint(given, TranslateOptions("cpu", precision, shortlist=str(path)))
            for hyps in t._hypotheses(LINES, 1, t._search)[1]:
                assert hyps and all(set(h.tokens) <= set(few.tolist()) for h in hyps)
    assert isinstance(t.model, Ensemble)


def test_a_shortlist_for_another_tokenizer_or_no_shortlist_is_refused(tok: Tokenizer, tmp_path: Path) -> None:
    other = Tokenizer.train(["ganz andere Wörter hier", "quite other words here"] * 10, vocab_size=300)
    path = tmp_path / "other.safetensors"
    Shortlist.count([([5], [6])], other, per_token=2, frequent=2).save(path)
    with pytest.raises(ConfigError, match="made for another tokenizer"):
        Shortlist.load(path, tok)
    with pytest.raises(ConfigError, match="does not exist; make one with tfm shortlist"):
        Shortlist.load(tmp_path / "none.safetensors", tok)
    (damaged := tmp_path / "damaged.safetensors").write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match="cannot be read"):
        Shortlist.load(damaged, tok)
