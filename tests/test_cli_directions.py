"""A model of several directions through the command line and the server: trained on both directions of the sample
corpus, it translates with --to (required: it has two targets), evaluates each direction apart and serves "to"."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import ENV, one_error_line
from serve_helpers import call, post, serving, translator_of
from tiny import QUICKSTART, SAMPLE, TINY_SETS

from transformer import checkpoint
from transformer.decoding.attention_maps import attention_maps
from transformer.serving.checks import Limits


def tfm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def best(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("directions")
    sets = [*TINY_SETS, f"--set=run_dir={runs}", "--set=train.max_steps=4", "--set=train.eval_every=4"]
    r = tfm("train", "--config", str(QUICKSTART), *sets, "--set=data.directions=[de-en, en-de]", "--quiet")
    assert r.returncode == 0, r.stderr
    return runs / "quickstart" / "best"


def test_translate_needs_to_and_refuses_a_target_the_model_lacks_or_a_typed_tag(best: Path) -> None:
    assert "translates into de, en; say which with --to" in one_error_line(
        tfm("translate", "Hallo", "--checkpoint", str(best)).stderr
    )
    r = tfm("translate", "Ein Hund läuft.", "--checkpoint", str(best), "--to", "en", "--greedy")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = tfm("translate", "Ein Hund läuft.", "--checkpoint", str(best), "--to", "fr")
    assert "does not translate into 'fr'; its target languages: de, en" in one_error_line(r.stderr)
    r = tfm("translate", ">>en<< Ein Hund läuft.", "--checkpoint", str(best), "--to", "en")
    assert "starts with the tag >>en<<, which tfm adds itself" in one_error_line(r.stderr)


def test_eval_scores_each_direction_with_its_own_report(best: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports"
    r = tfm("eval", "--checkpoint", str(best), "--output-dir", str(out), "--beam", "1")
    assert r.returncode == 0, r.stderr
    assert "valid.de-en:" in r.stdout and "valid.en-de:" in r.stdout and r.stdout.count("BLEU = ") == 2
    de_en = json.loads((out / "valid.de-en.beam1.json").read_text())
    en_de = json.loads((out / "valid.en-de.beam1.json").read_text())
    assert "--to en" in de_en["command"] and "--to de" in en_de["command"]
    r = tfm("eval", "--checkpoint", str(best), "--output-dir", str(tmp_path / "one"), "--beam", "1", "--to", "de")
    assert r.returncode == 0 and r.stdout.count("BLEU = ") == 1, r.stderr
    assert sorted(p.name for p in (tmp_path / "one").glob("*.json")) == ["valid.en-de.beam1.json"]
    r = tfm("eval", "--checkpoint", str(best), "--from", "fr")
    assert "the model translates de-en, en-de; no direction matches --from fr" in one_error_line(r.stderr)


def test_the_server_takes_to_and_lists_the_directions(best: Path) -> None:
    loaded = checkpoint.load(best)
    with serving(loaded, Limits(), translator_of(loaded)) as url:
        info = call(url, "GET", "/info")[1]
        assert info["directions"] == ["de-en", "en-de"] and info["targets"] == ["de", "en"]
        status, answer = post(url, "/translate", {"text": ["Ein Hund läuft."], "to": "en", "beam": 1})
        greedy = translator_of(loaded).to("en")
        greedy = greedy.with_decode(dataclasses.replace(greedy.decode, beam=1))
        assert (
            status == 200 and answer["translations"][0]["text"] == greedy.translate_chunk(["Ein Hund läuft."])[0].best
        )
        status, answer = post(url, "/translate", {"text": ["Ein Hund läuft."]})
        assert status == 422 and 'send "to" with one of them' in answer["error"]
        status, answer = post(url, "/translate", {"text": ["Ein Hund läuft."], "to": "fr"})
        assert status == 422 and "does not translate into it" in answer["error"]


def test_the_attention_picture_shows_the_tag_labelled_first(best: Path, tmp_path: Path) -> None:
    loaded = checkpoint.load(best)
    maps = attention_maps(loaded.model, loaded.tokenizer, "Ein Hund läuft.", tag=loaded.tokenizer.tags["en"])
    assert maps.cols[0] == ">>en<<" and maps.cols[1:-1] == [
        loaded.tokenizer.id_to_token(i) for i in loaded.tokenizer.encode("Ein Hund läuft.")
    ]
    r = tfm("attention", "Ein Hund läuft.", "--checkpoint", str(best), "--output", str(tmp_path / "a.png"))
    assert "say which with --to" in one_error_line(r.stderr)
    with serving(loaded, Limits(), translator_of(loaded)) as url:
        status, answer = post(url, "/attention", {"text": "Ein Hund läuft.", "to": "en"})
        assert status == 200 and answer["source"][0] == ">>en<<"
        status, answer = post(url, "/attention", {"text": "Ein Hund läuft."})
        assert status == 422


def test_eval_scores_a_pair_never_trained_zero_shot(tmp_path: Path) -> None:
    corpus = tmp_path / "three"
    corpus.mkdir()
    for split in ("train", "valid"):
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_bytes((SAMPLE / f"{split}.{lang}").read_bytes())
        (corpus / f"{split}.fr").write_text((SAMPLE / f"{split}.en").read_text().upper())
    runs = tmp_path / "runs"
    sets = [
        *TINY_SETS,
        f"--set=run_dir={runs}",
        f"--set=data.path={corpus}",
        "--set=train.max_steps=2",
        "--set=train.eval_every=2",
    ]
    r = tfm("train", "--config", str(QUICKSTART), *sets, "--set=data.directions=[de-en, en-fr]", "--quiet")
    assert r.returncode == 0, r.stderr
    best = runs / "quickstart" / "best"
    out = tmp_path / "reports"
    r = tfm("eval", "--checkpoint", str(best), "--from", "de", "--to", "fr", "--beam", "1", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    assert "zero-shot: the model never trained de-fr" in r.stdout and r.stdout.count("BLEU = ") == 1
    assert [p.name for p in out.glob("*.json")] == ["valid.de-fr.beam1.json"]
    r = tfm("eval", "--checkpoint", str(best), "--from", "fr", "--to", "en")
    assert "the model translates de-en, en-fr; no direction matches --from fr --to en" in one_error_line(r.stderr)
