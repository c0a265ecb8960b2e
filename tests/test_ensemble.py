"""Ensembles (transformer/decoding/ensemble.py): one model decodes as itself, a model with itself as the model alone,
two models as a reference ensemble written here from their teacher-forced logits; members that cannot decode
together are refused in one line; translate, eval and export take several checkpoints."""

from __future__ import annotations

import json
import signal
from dataclasses import replace

import pytest
import torch
from cli_helpers import one_error_line
from serve_helpers import call, post, serve
from torch import Tensor, nn
from typer.testing import CliRunner

from cli.main import app
from transformer import checkpoint
from transformer.config import ModelConfig
from transformer.decoding.attention_maps import attention_maps
from transformer.decoding.ensemble import Ensemble, check_members
from transformer.decoding.search import beam_search, greedy_search
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.errors import ConfigError
from transformer.model.transformer import Transformer
from transformer.text.tokenizer import Tokenizer

START, END = 1, 2


def _model(seed: int, N: int = 2, d_model: int = 32) -> Transformer:
    """An untrained model made decisive: its output table (tied to the embeddings) scaled up so that the best next
    tokens stand apart by more than float rounding, and searches compared across implementations do not meet ties."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(N=N, d_model=d_model, d_ff=64, h=4, dropout=0.0), 60, 0).eval()
    with torch.no_grad():
        model.generator.weight.mul_(6.0)
    return model


class _Prefixes:
    """The reference's state: the source and each row's tokens so far, reordered as the search asks."""

    def __init__(self, src: Tensor) -> None:
        self.src, self.tokens = src, src.new_empty(src.size(0), 0)

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.tokens = self.tokens[rows]
        if sentences is not None:
            self.src = self.src[sentences]


class _Reference(nn.Module):
    """An ensemble as the issue defines it, written plainly: each step runs every model over the whole prefix at once
    (no cache), and the next-token distribution is the log of the mean of their softmaxed last logits."""

    def __init__(self, models: list[Transformer]) -> None:
        super().__init__()
        self.models, self.pad_id = nn.ModuleList(models), models[0].pad_id

    def encode(self, src: Tensor) -> tuple[Tensor, None]:
        return src, None

    def start_state(self, src: Tensor, _: None) -> _Prefixes:
        return _Prefixes(src)

    def decode_step(self, tokens: Tensor, state: _Prefixes) -> Tensor:
        state.tokens = torch.cat([state.tokens, tokens[:, None]], 1)
        src = state.src.repeat_interleave(state.tokens.size(0) // state.src.size(0), 0)  # a sentence's rows together
        probs = [m(src, state.tokens)[:, -1].float().softmax(-1) for m in self.models]
        return torch.stack(probs).mean(0).log()


def _greedy(model: nn.Module, src: Tensor) -> list[tuple[list[int], float]]:
    with torch.inference_mode():
        return [(h.tokens, h.score) for h in greedy_search(model, src, START, END, 1.0, 4)]


def _beam(model: nn.Module, src: Tensor) -> list[tuple[list[int], float]]:
    with torch.inference_mode():
        found = beam_search(model, src, START, END, beam=4, alpha=1.0, nbest=3, max_len_a=1.0, max_len_b=4)
    return [(h.tokens, h.score) for hyps in found for h in hyps]


def _same(got: list[tuple[list[int], float]], want: list[tuple[list[int], float]]) -> None:
    """The same hypotheses in the same order, their scores equal up to float sums taken in another order."""
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)


SRC = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 0, 0, 0], [12, 13, 14, 0, 0]])  # sentences reach their limits apart


@pytest.mark.parametrize("search", [_greedy, _beam])
def test_a_model_with_itself_decodes_as_the_model_alone(search):
    model = _model(0)
    _same(search(Ensemble([model, model]), SRC), search(model, SRC))


@pytest.mark.parametrize("search", [_greedy, _beam])
def test_two_models_decode_as_the_reference_ensemble_from_their_logits(search):
    a, b = _model(0), _model(1, N=1, d_model=48)  # shapes and depth may differ
    got, want = search(Ensemble([a, b]), SRC), search(_Reference([a, b]), SRC)
    _same(got, want)
    assert [t for t, _ in got] != [t for t, _ in search(a, SRC)]  # the second model changed something


def test_the_mean_of_probabilities_not_of_log_probabilities():
    """A token one member rules out keeps the other's mass: log((p_a + p_b) / 2), not (log p_a + log p_b) / 2."""
    a, b = _model(0), _model(1)
    ensemble = Ensemble([a, b])
    with torch.inference_mode():
        lprobs = ensemble.decode_step(torch.tensor([START]), ensemble.start_state(*ensemble.encode(SRC[:1])))
        alone = [m.decode_step(torch.tensor([START]), m.start_state(*m.encode(SRC[:1]))).softmax(-1) for m in (a, b)]
    torch.testing.assert_close(lprobs.exp(), (alone[0] + alone[1]) / 2)


@pytest.fixture(scope="module")
def members(tiny_checkpoint, tmp_path_factory):
    """tiny_checkpoint and a second model of another seed and depth beside it, with the same tokenizer."""
    first = checkpoint.load(tiny_checkpoint, "cpu")
    cfg = replace(first.cfg, model=replace(first.cfg.model, N=2))
    torch.manual_seed(1)
    from transformer.model.transformer import Transformer

    model = Transformer(cfg.model, first.tokenizer.vocab_size, first.tokenizer.pad_id)
    second = checkpoint.save(tmp_path_factory.mktemp("second") / "ck", cfg, first.tokenizer, model, {"step": 0})
    return tiny_checkpoint, second


LINES = ["Ein Hund läuft.", "Zwei Männer sitzen auf einer Bank.", "", "Eine Frau."]


def test_an_ensemble_of_one_checkpoint_is_that_model_alone(members):
    first, _ = members
    options = TranslateOptions("cpu", beam=3, nbest=2)
    alone, one = Translator.from_checkpoint(first, options), Translator.from_checkpoint([first], options)
    assert not isinstance(one.model, Ensemble)
    assert list(one.translate(LINES)) == list(alone.translate(LINES))  # texts and scores, exactly


def test_translator_decodes_several_checkpoints_as_one_ensemble(members):
    options = TranslateOptions("cpu", beam=3)
    ensemble = Translator.from_checkpoint(list(members), options)
    assert isinstance(ensemble.model, Ensemble) and len(ensemble.members) == 2
    want = Translator.from_checkpoint(members[0], options)
    want.model = Ensemble([want.model, Translator.from_checkpoint(members[1], options).model])
    assert list(ensemble.translate(LINES)) == list(want.translate(LINES))


def test_checkpoints_that_cannot_decode_together_are_refused_naming_both(members, tmp_path):
    first = checkpoint.load(members[0], "cpu")
    data = first.cfg.data

    def other(**changes) -> checkpoint.Loaded:
        return replace(first, cfg=replace(first.cfg, data=replace(data, **changes)), path=tmp_path / "other")

    check_members([first, first])
    for changed, says in (
        (other(src_lang="fr"), "translate de->en and fr->en"),
        (other(lowercase=True), "trained on cased and lowercased text"),
        (
            replace(first, tokenizer=Tokenizer.train(["ein zwei drei"] * 5, vocab_size=300), path=tmp_path / "other"),
            "have different tokenizers",
        ),
    ):
        with pytest.raises(ConfigError) as e:
            check_members([first, changed])
        assert says in str(e.value) and str(members[0]) in str(e.value) and str(tmp_path / "other") in str(e.value)


def test_translate_eval_and_export_take_several_checkpoints(members, tmp_path):
    first, second = members
    both = ["--checkpoint", str(first), "--checkpoint", str(second)]
    r = CliRunner().invoke(app, ["translate", "Ein Hund läuft.", *both, "--device", "cpu", "--beam", "2"])
    assert (
        r.exit_code == 0
        and r.stdout.strip()
        == Translator.from_checkpoint([first, second], TranslateOptions("cpu", beam=2))
        .translate_chunk(["Ein Hund läuft."])[0]
        .best
    )
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\nDie Frau.\n", encoding="utf-8")
    ref.write_text("A dog.\nThe woman.\n", encoding="utf-8")
    out = tmp_path / "out"
    args = ["eval", *both, "--src", str(src), "--ref", str(ref), "--device", "cpu", "--beam", "2"]
    r = CliRunner().invoke(app, [*args, "--output-dir", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "src.de.beam2.ensemble2.json").read_text())
    assert report["command"].startswith(f"tfm eval --checkpoint {first} --checkpoint {second} ")
    assert [m["checkpoint"] for m in report["members"]] == [str(first), str(second)]
    for member in report["members"]:
        assert member["command"].startswith(f"tfm eval --checkpoint {member['checkpoint']} --src")
        assert f"alone: BLEU = {member['bleu']:.2f}" in r.stdout and member["command"] in r.stdout
    r = CliRunner().invoke(app, ["export", *both, "--output", str(tmp_path / "x")])
    assert r.exit_code == 2 and "export each --checkpoint on its own" in one_error_line(r.stderr)
    assert not (tmp_path / "x").exists()


def test_a_mismatch_on_the_command_line_is_one_line_and_exit_2(members, tmp_path):
    first = checkpoint.load(members[0], "cpu")
    cfg = replace(first.cfg, data=replace(first.cfg.data, src_lang="fr"))
    other = checkpoint.save(tmp_path / "fr", cfg, first.tokenizer, first.model, {"step": 0})
    r = CliRunner().invoke(
        app, ["translate", "Ein Hund.", "--checkpoint", str(members[0]), "--checkpoint", str(other), "--device", "cpu"]
    )
    assert r.exit_code == 2 and "translate de->en and fr->en" in one_error_line(r.stderr)


def test_serve_decodes_with_an_ensemble_and_says_so(members, tmp_path):
    first, second = members
    proc, url = serve(first, tmp_path / "serve.err", "--checkpoint", str(second))
    try:
        status, info = call(url, "GET", "/info")
        assert status == 200 and [m["checkpoint"] for m in info["ensemble"]] == [str(first), str(second)]
        status, answer = post(url, "/translate", {"text": LINES, "beam": 2})
        want = Translator.from_checkpoint([first, second], TranslateOptions("cpu", beam=2)).translate_chunk(LINES)
        assert status == 200 and [t["text"] for t in answer["translations"]] == [t.best for t in want]
    finally:
        proc.p.send_signal(signal.SIGTERM)
        proc.finish()


@pytest.mark.parametrize("precision", ["fp32", "int8", "bf16"])
def test_decoding_an_ensemble_leaves_every_module_of_its_members_in_the_mode_it_had(tiny_run, precision):
    """Two loaded checkpoints, one in eval mode and one as loaded; after the ensemble has translated, each module of
    each keeps its mode, and the attention picture of a member is a fresh copy's."""
    a = checkpoint.load(tiny_run.run_dir / "best")
    b = checkpoint.load(tiny_run.run_dir / "checkpoints" / "step_3")
    a.model.eval()
    modes = [[m.training for m in loaded.model.modules()] for loaded in (a, b)]
    ensemble = Translator.from_checkpoint([a, b], TranslateOptions("cpu", precision, beam=2))
    assert not any(m.training for m in ensemble.model.modules())
    list(ensemble.translate(LINES * 20))
    assert [[m.training for m in loaded.model.modules()] for loaded in (a, b)] == modes
    fresh = checkpoint.load(tiny_run.run_dir / "best")
    for sentence in LINES[:2]:
        got, want = (
            attention_maps(a.model, a.tokenizer, sentence),
            attention_maps(fresh.model, fresh.tokenizer, sentence),
        )
        assert (got.rows, got.cols) == (want.rows, want.cols) and torch.equal(got.weights, want.weights)
    assert [[m.training for m in loaded.model.modules()] for loaded in (a, b)] == modes
