"""``tfm export --format ctranslate2``: CTranslate2 must run exactly tfm's network (skipped without ctranslate2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from tiny import ROOT, tiny_config
from typer.testing import CliRunner

from cli.main import app
from transformer import checkpoint
from transformer.decoding.search import greedy_search
from transformer.errors import ExportError, OutputError
from transformer.export.write import export
from transformer.model.transformer import Transformer

ctranslate2 = pytest.importorskip("ctranslate2")

LINES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch.", "Hallo"]


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def saved(request, tmp_path, sample_tokenizer):
    """A randomly initialised tiny checkpoint (post- or pre-norm) and its loaded form."""
    cfg = tiny_config(tmp_path, model={"norm_first": request.param, "dropout": 0.0})
    torch.manual_seed(0)
    model = Transformer(cfg.model, sample_tokenizer.vocab_size, sample_tokenizer.pad_id)
    path = checkpoint.save(tmp_path / "ckpt", cfg, sample_tokenizer, model, {"step": 0})
    return path, checkpoint.load(path)


def _tokens(tok, ids: list[int]) -> list[str]:
    return [tok.id_to_token(i) for i in ids]


def test_ctranslate2_scores_match_tfm(saved, tmp_path):
    path, loaded = saved
    out = export(path, tmp_path / "ct2")
    tok, model = loaded.tokenizer, loaded.model.eval()
    translator = ctranslate2.Translator(str(out), device="cpu")
    src = [tok.encode(line) for line in LINES]
    tgt = [tok.encode(t) for t in ["A man rides a bike.", "Two dogs.", "A woman reads a book.", "Hello"]]
    scored = translator.score_batch([_tokens(tok, s) for s in src], [_tokens(tok, t) for t in tgt])
    for s, t, result in zip(src, tgt, scored):
        with torch.no_grad():
            logits = model(torch.tensor([s + [tok.end_id]]), torch.tensor([[tok.start_id] + t]))
        want = logits.log_softmax(-1)[0].gather(-1, torch.tensor(t + [tok.end_id])[:, None])[:, 0]
        assert result.log_probs == pytest.approx(want.tolist(), abs=1e-4)


def test_ctranslate2_greedy_matches_tfm(saved, tmp_path):
    path, loaded = saved
    out = export(path, tmp_path / "ct2")
    tok = loaded.tokenizer
    translator = ctranslate2.Translator(str(out), device="cpu")
    for line in LINES:
        ids = tok.encode(line)
        ours = greedy_search(loaded.model, torch.tensor([ids + [tok.end_id]]), tok.start_id, tok.end_id, max_len_b=10)[
            0
        ].tokens
        theirs = translator.translate_batch([_tokens(tok, ids)], beam_size=1, max_decoding_length=len(ids) + 1 + 10)[
            0
        ].hypotheses[0]
        assert _tokens(tok, ours) == theirs


def test_export_refuses_to_overwrite_and_unknown_formats(saved, tmp_path):
    path, _ = saved
    export(path, tmp_path / "ct2")
    with pytest.raises(ExportError, match="already exists"):
        export(path, tmp_path / "ct2")
    export(path, tmp_path / "ct2", overwrite=True)  # an earlier export is replaced
    (tmp_path / "ct2" / "notes.txt").write_text("the user's\n", encoding="utf-8")
    with pytest.raises(OutputError, match="notes.txt', which tfm did not write"):  # a file of the user's is never lost
        export(path, tmp_path / "ct2", overwrite=True)
    assert (tmp_path / "ct2" / "notes.txt").is_file()
    with pytest.raises(ExportError, match="unknown export format"):
        export(path, tmp_path / "other", fmt="onnx")


def test_tfm_export_command(saved, tmp_path):
    """`tfm export` writes the model and prints its folder; an unknown format is a user error (exit 2)."""
    path, _ = saved
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def tfm(*args):
        return subprocess.run(
            [sys.executable, "-m", "cli", "export", "--checkpoint", str(path), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    ok = tfm("--output", str(tmp_path / "ct2"))
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "ct2" / "model.bin").is_file() and ok.stdout.strip() == str(tmp_path / "ct2")
    bad = tfm("--output", str(tmp_path / "other"), "--format", "onnx")
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown export format")


def _export(*args: str):
    return CliRunner().invoke(app, ["export", *args])


def test_an_output_of_dot_a_loop_or_the_checkpoint_itself_is_one_line(saved, tmp_path, monkeypatch):
    path, _ = saved
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine\n")
    monkeypatch.chdir(work)
    r = _export("--checkpoint", str(path), "--output", ".", "--overwrite")
    assert r.exit_code == 2 and "notes.txt', which tfm did not write" in r.stderr, r.output
    assert "Traceback" not in r.output and (work / "notes.txt").read_text() == "mine\n"
    monkeypatch.chdir(tmp_path)  # the folder holds the checkpoint
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    r = _export("--checkpoint", str(path), "--output", "loop1")
    assert r.exit_code == 2 and "'loop1' is a symbolic link that loops" in r.stderr, r.output
    r = _export("--checkpoint", str(path), "--output", str(path), "--overwrite")
    assert r.exit_code == 2 and f"is a folder holding '{path / checkpoint.CONFIG}'" in r.stderr, r.output
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("fmt", ["ctranslate2", "hf"])
def test_a_full_disk_is_one_line_and_leaves_no_partial_export(saved, small_disk, fmt):
    path, loaded = saved
    if fmt == "hf" and loaded.cfg.model.norm_first:
        pytest.skip("Marian has no pre-norm layers")
    (small_disk / "filler").write_bytes(b"\0" * 550_000)
    r = _export("--checkpoint", str(path), "--output", str(small_disk / "out"), "--format", fmt)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"cannot write {small_disk / 'out'}: no space left on the device" in r.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_multilingual_export_translates_with_the_tag_among_its_tokens(tiny_tagged_run, tmp_path):
    """CTranslate2 is given tokens: a tagged model's source tokens start with the tag, as tfm's do."""
    loaded = checkpoint.load(tiny_tagged_run.run_dir / "best")
    out = export(loaded.path, tmp_path / "ct2")
    tok = loaded.tokenizer
    translator = ctranslate2.Translator(str(out), device="cpu")
    for target, line in (("de", "A man rides a bike."), ("en", "Ein Mann fährt Fahrrad.")):
        ids = [tok.tags[target], *tok.encode(line)]
        assert _tokens(tok, ids)[0] == f">>{target}<<"
        src = torch.tensor([ids + [tok.end_id]])
        ours = greedy_search(loaded.model, src, tok.start_id, tok.end_id, max_len_b=10)[0].tokens
        never = [[tok.START], [tok.PAD]]  # tfm's search never generates them
        limit = len(ids) + 1 + 10
        theirs = translator.translate_batch(
            [_tokens(tok, ids)], beam_size=1, max_decoding_length=limit, suppress_sequences=never
        )
        assert _tokens(tok, ours) == theirs[0].hypotheses[0]


def test_an_encoder_and_a_decoder_of_different_depths_run_in_ctranslate2(tmp_path, sample_tokenizer):
    cfg = tiny_config(tmp_path, model={"dropout": 0.0, "encoder_layers": 3, "decoder_layers": 1})
    torch.manual_seed(0)
    model = Transformer(cfg.model, sample_tokenizer.vocab_size, sample_tokenizer.pad_id)
    path = checkpoint.save(tmp_path / "ckpt", cfg, sample_tokenizer, model, {"step": 0})
    loaded = checkpoint.load(path)
    tok = loaded.tokenizer
    translator = ctranslate2.Translator(str(export(path, tmp_path / "ct2")), device="cpu")
    for line in LINES:
        ids = tok.encode(line)
        ours = greedy_search(loaded.model, torch.tensor([ids + [tok.end_id]]), tok.start_id, tok.end_id, max_len_b=10)
        limit, never = len(ids) + 1 + 10, [[tok.START], [tok.PAD]]  # tfm's search never generates them
        theirs = translator.translate_batch(
            [_tokens(tok, ids)], beam_size=1, max_decoding_length=limit, suppress_sequences=never
        )
        assert _tokens(tok, ours[0].tokens) == theirs[0].hypotheses[0]
