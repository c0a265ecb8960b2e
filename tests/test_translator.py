"""Translator: one output per input line, in order, whatever the batching; bad lines handled."""

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import tiny_config

from transformer import checkpoint
from transformer.checkpoint import Loaded
from transformer.decoding.search import greedy_search
from transformer.decoding.translator import TranslateOptions, Translator, clean_line
from transformer.errors import ConfigError, TranslateError
from transformer.model.transformer import Transformer
from transformer.text.tokenizer import Tokenizer

SENTENCES = ["Ein Mann fährt Fahrrad.", "A man rides a bike.", "Der Hund läuft im Park.", "The dog runs."] * 20


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return tiny_config(tmp_path_factory.mktemp("t"), decode={"max_len_b": 4, "batch_tokens": 64})


@pytest.fixture(scope="module")
def tok(cfg):
    return Tokenizer.train(SENTENCES, vocab_size=cfg.tokenizer.vocab_size)


@pytest.fixture(scope="module")
def model(cfg, tok):
    torch.manual_seed(0)
    return Transformer(cfg.model, tok.vocab_size, tok.pad_id)


def run(cfg, tok, model, **changes) -> Loaded:
    """The untrained model as a checkpoint would hold it, its config changed by ``changes`` (section=dict)."""
    cfg = replace(cfg, **{k: replace(getattr(cfg, k), **v) for k, v in changes.items()})
    return Loaded(cfg, tok, model, {}, cfg.out_dir)


@pytest.fixture(scope="module")
def translator(cfg, tok, model):
    t = Translator.from_checkpoint(run(cfg, tok, model), TranslateOptions("cpu"))
    t.warn = lambda msg: None
    return t


def with_decode(t: Translator, **decode) -> Translator:
    """The fixture's model and tokenizer with other decode settings."""
    return t.with_decode(replace(t.decode, **decode))


def test_clean_line():
    assert clean_line("\ufeffEin  Mann\tfährt.\r") == "Ein Mann fährt."
    assert clean_line("a\x00b\x07c") == "a b c"
    assert clean_line("   ") == ""


def test_one_line_out_per_line_in_and_empty_stays_empty(translator):
    lines = ["Ein Mann.", "", "   ", "Der Hund läuft im Park und der Mann fährt Fahrrad.", "\ufeff\r", "😀 Привет 我们"]
    out = with_decode(translator, beam=2).translate_chunk(lines)
    assert len(out) == len(lines)
    assert [o.best for o in out][1:3] == ["", ""] and out[4].best == ""


def test_order_and_chunking_do_not_change_results(translator):
    lines = [" ".join(["Mann"] * n) + " fährt." for n in (5, 1, 9, 3, 7, 2)]
    beam2 = with_decode(translator, beam=2)
    whole = [t.best for t in beam2.translate(lines, chunk=100)]
    chunked = [t.best for t in beam2.translate(lines, chunk=2)]
    reversed_ = [t.best for t in beam2.translate(lines[::-1])][::-1]
    assert whole == chunked == reversed_


def test_best_under_each_alpha_is_translating_at_that_alpha(translator):
    """One search for a grid of length penalties gives, line for line, what translating at each penalty gives;
    an empty line stays empty."""
    lines = [" ".join(["Mann"] * n) + " fährt." for n in (5, 1, 9, 3)] + ["", "Der Hund läuft."]
    alphas = [0.0, 0.6, 2.0, 5.0]
    grid = with_decode(translator, beam=3, max_len_b=8).best_under(lines, alphas)
    for alpha, texts in zip(alphas, grid):
        assert texts == [t.best for t in with_decode(translator, beam=3, max_len_b=8, alpha=alpha).translate(lines)]
    assert all(texts[4] == "" for texts in grid)


def test_too_long_lines_truncate_or_error(translator):
    long = "Mann " * 500
    warnings = []
    greedy = with_decode(translator, beam=1)
    greedy.warn = warnings.append
    assert len(greedy.translate_chunk([long, "Hund"])) == 2
    assert warnings and "line 1" in warnings[0] and "truncated" in warnings[0]
    with pytest.raises(TranslateError, match="line 1: .* tokens"):
        with_decode(translator, beam=1, too_long="error").translate_chunk([long])


def test_each_setting_is_checked_as_a_translator_is_made(cfg, tok, model):
    """nbest against the beam, the beam against the vocabulary, the device and the precision, each in one line."""
    refused = {
        "nbest 3 is larger than the beam 2; ask for at most 2": TranslateOptions("cpu", beam=2, nbest=3),
        "beam 100000 is larger than the model's vocabulary": TranslateOptions("cpu", beam=100_000),
    }
    for message, options in refused.items():
        with pytest.raises(ConfigError, match=message):
            Translator.from_checkpoint(run(cfg, tok, model), options)
    with pytest.raises(ConfigError, match="device 'gpu' is not one of"):
        TranslateOptions("gpu")
    with pytest.raises(ConfigError, match="precision 'fp8' is not one of"):
        TranslateOptions("cpu", "fp8")


def test_options_given_win_over_the_checkpoints_and_the_rest_are_its(cfg, tok, model):
    t = Translator.from_checkpoint(run(cfg, tok, model), TranslateOptions("cpu", beam=3, alpha=1.5))
    assert (t.decode.beam, t.decode.alpha, t.decode.nbest) == (3, 1.5, cfg.decode.nbest)
    assert t.decode.max_len_b == cfg.decode.max_len_b and t.precision == "fp32" and t.device == torch.device("cpu")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=30),
        min_size=1,
        max_size=6,
    )
)
def test_any_unicode_gives_one_line_per_input(translator, lines):
    """Any str, with newlines inside and lone surrogates (Python's stand-ins for undecodable argv bytes)."""
    out = with_decode(translator, beam=1).translate_chunk(lines)
    assert len(out) == len(lines)
    assert all("\n" not in o.best for o in out)


def test_half_precision_translates_as_autocast_over_the_model(translator, model):
    """bf16 decoding (on a copy with bf16 Linear weights): the same output as autocast over the fp32 model."""
    t = Translator.from_checkpoint(translator.members[0], TranslateOptions("cpu", "bf16", beam=3, nbest=2))
    assert t.model is not model
    lines = SENTENCES[:8]
    fp32 = Translator.from_checkpoint(translator.members[0], TranslateOptions("cpu", beam=3, nbest=2))
    fp32.model = model  # autocast over the model itself, as the bf16 copy stands for it
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = [(o.texts, o.scores) for o in fp32.translate_chunk(lines)]
    assert [(o.texts, o.scores) for o in t.translate_chunk(lines)] == want


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=60))
def test_translator_input_path_never_crashes_the_tokenizer(sample_tokenizer, s):
    """Any str, lone surrogates included (how argv hands over bad bytes): cleaned, it encodes and round-trips."""
    line = clean_line(s)
    [ids] = sample_tokenizer.encode_batch([line])
    assert sample_tokenizer.unk_id not in ids
    assert sample_tokenizer.decode(ids) == sample_tokenizer.normalize(line)


def test_a_model_trained_on_lowercased_text_gets_its_input_lowercased(translator, cfg, tok, model):
    lower = Translator.from_checkpoint(run(cfg, tok, model, data={"lowercase": True}), TranslateOptions("cpu"))
    lines = ["Ein Mann fährt Fahrrad.", "DER HUND LÄUFT IM PARK."]
    want = [(o.texts, o.scores) for o in translator.translate_chunk([line.lower() for line in lines])]
    assert [(o.texts, o.scores) for o in lower.translate_chunk(lines)] == want
    assert [(o.texts, o.scores) for o in translator.translate_chunk(lines)] != want  # the cased input differs


def test_precision_auto_decodes_in_the_precision_it_chose(translator, model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    auto = Translator.from_checkpoint(translator.members[0], TranslateOptions("cpu", "auto"))
    assert auto.precision in ("fp32", "bf16", "int8")
    chosen = Translator.from_checkpoint(translator.members[0], TranslateOptions("cpu", auto.precision))
    lines = SENTENCES[:4]
    assert [o.texts for o in auto.translate_chunk(lines)] == [o.texts for o in chosen.translate_chunk(lines)]


@pytest.mark.parametrize("beam", [1, 3])
def test_an_int8_sentence_translates_the_same_alone_and_in_batches_of_8_64_and_256(tiny_run, beam):
    """Each row of int8 activations has its own scale, so a sentence's text and score do not depend on the other
    sentences decoded with it (a server batch, a file, the alpha grid): the score as printed (4 decimals) is the
    same; below that, float sums of another batch's shapes add up in another order, as in fp32."""
    options = TranslateOptions("cpu", "int8", beam=beam, nbest=1, batch_tokens=100_000)
    t = Translator.from_checkpoint(tiny_run.run_dir / "best", options)
    others = [f"{s} {i}" for i, s in enumerate(SENTENCES * 4)]
    alone = t.translate_chunk([SENTENCES[2]])[0]
    for n in (8, 64, 256):
        together = t.translate_chunk([SENTENCES[2], *others[: n - 1]])[0]
        assert together.texts == alone.texts and together.scores == pytest.approx(alone.scores, abs=1e-5), n


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_a_greedy_score_is_its_log_probability_over_the_penalty_at_the_alpha_in_force(tiny_run, alpha):
    """score = sum of the tokens' log-probabilities (<END> included) / ((5 + length) / 6) ** alpha, length counting
    <END>, for greedy search as for beam search; here from the model's own teacher-forced log-probabilities."""
    loaded = checkpoint.load(tiny_run.run_dir / "best")
    t = Translator.from_checkpoint(loaded, TranslateOptions("cpu", beam=1, alpha=alpha))
    tok, model = loaded.tokenizer, loaded.model.eval()
    for line in SENTENCES[:4]:
        got = t.translate_chunk([line])[0]
        src = torch.tensor([tok.encode(line) + [tok.end_id]])
        ids = greedy_search(model, src, tok.start_id, tok.end_id, t.decode.max_len_a, t.decode.max_len_b)[0].tokens
        assert got.best == tok.decode(ids)
        with torch.no_grad():
            logits = model(src, torch.tensor([[tok.start_id, *ids]]))
        targets = torch.tensor(ids + [tok.end_id])
        log_prob = logits.log_softmax(-1)[0].gather(1, targets[:, None]).sum().item()
        assert got.scores[0] == pytest.approx(log_prob / ((5 + len(ids) + 1) / 6) ** alpha, abs=1e-4)
