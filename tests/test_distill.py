"""Sequence-level distillation: a tiny teacher's translations of the sample corpus become an ordinary corpus of one
line per training source, in pieces that a killed run does not translate twice, and a student learns from them with
the teacher's tokenizer; what cannot be distilled is refused in one line."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from tiny import QUICKSTART, SAMPLE, TINY_SETS, tiny_config
from typer.testing import CliRunner

from cli.main import app
from transformer import checkpoint
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.errors import TrainError
from transformer.model.transformer import Transformer
from transformer.training import distill


def _cfg(tmp_path: Path, teacher: Path, **changes):
    values = {"distill": {"teachers": [str(teacher)], "piece_lines": 100}, **changes}
    return tiny_config(tmp_path, **values)


def test_a_killed_distillation_goes_on_where_it_stopped_and_gives_the_unbroken_corpus(tiny_run, tmp_path, monkeypatch):
    teacher = tiny_run.run_dir / "best"
    unbroken = _cfg(tmp_path / "a", teacher)
    found = distill.teachers(unbroken, TranslateOptions("cpu", beam=2), print)
    distill.distil(unbroken, found, True, print)
    whole = {
        p.name: p.read_bytes() for p in distill.folder(unbroken).iterdir() if p.name.startswith(("train", "piece"))
    }
    n_sources = len((SAMPLE / "train.de").read_text(encoding="utf-8").splitlines())
    assert len(whole["train.en"].decode("utf-8").split("\n")) - 1 == n_sources == len(whole["train.de"].splitlines())

    broken = _cfg(tmp_path / "b", teacher)
    calls: list[int] = []
    killed: list[bool] = []
    real = Translator.translate

    def translate(self, lines, chunk=1000, prefixes=None, align=False):
        calls.append(len(lines))
        if len(calls) == 3 and not killed:
            killed.append(True)
            raise RuntimeError("killed")  # while translating the third piece
        return real(self, lines, chunk, prefixes, align)

    monkeypatch.setattr(Translator, "translate", translate)
    found = distill.teachers(broken, TranslateOptions("cpu", beam=2), print)
    with pytest.raises(RuntimeError, match="killed"):
        distill.distil(broken, found, True, print)
    assert sorted(p.name for p in distill.folder(broken).glob("piece-*")) == ["piece-00000.en", "piece-00001.en"]
    calls.clear()
    distill.distil(broken, found, True, print)
    assert len(calls) == 4  # pieces 2 to 5 of 6: the finished ones are not translated again
    again = {p.name: p.read_bytes() for p in distill.folder(broken).iterdir() if p.name.startswith(("train", "piece"))}
    assert again == whole


def test_distil_train_and_translate_through_the_command_line(tiny_run, tmp_path):
    runs = tmp_path / "runs"
    args = ["distill", "--config", QUICKSTART, *TINY_SETS, f"--set=run_dir={runs}", "--set=train.max_steps=3"]
    args += ["--set=train.eval_every=3", "--set=distill.piece_lines=200", "--teacher", tiny_run.run_dir / "best", "-q"]
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    student = runs / "quickstart" / "best"
    recorded = yaml.safe_load((student / "config.yaml").read_text(encoding="utf-8"))
    assert recorded["distill"]["teachers"] == [str(tiny_run.run_dir / "best")]
    assert recorded["tokenizer"]["path"] == str(tiny_run.run_dir / "best" / "tokenizer.json")
    assert recorded["data"]["path"] == str(runs / "quickstart-distilled")
    assert (student / "tokenizer.json").read_bytes() == (tiny_run.run_dir / "best" / "tokenizer.json").read_bytes()
    out = CliRunner().invoke(app, ["translate", "Ein Hund.", "--checkpoint", str(student)])
    assert out.exit_code == 0, out.output
    assert list((student / "eval").glob("test.beam*.json"))  # the eval stage scored it on the test split


def test_what_cannot_be_distilled_is_refused_in_one_line(tiny_run, tmp_path):
    teacher = tiny_run.run_dir / "best"
    with pytest.raises(TrainError, match=r"takes its teacher's tokenizer, and its config asks for another \(tokenizer"):
        distill.teachers(_cfg(tmp_path, teacher, tokenizer={"vocab_size": 500}), TranslateOptions("cpu"), print)
    with pytest.raises(TrainError, match="translates de->en and the data en->de"):
        distill.teachers(
            _cfg(tmp_path, teacher, data={"src_lang": "en", "tgt_lang": "de"}), TranslateOptions("cpu"), print
        )
    said: list[str] = []
    big = _cfg(tmp_path, teacher, model={"N": 3, "d_model": 64, "d_ff": 128, "h": 2})
    distill.teachers(big, TranslateOptions("cpu"), said.append)
    assert any("is bigger than its teacher" in m for m in said)


def test_a_multilingual_teacher_distils_the_run_s_direction_with_its_tag(tiny_tagged_run, tmp_path):
    teacher = tiny_tagged_run.run_dir / "best"
    cfg = _cfg(tmp_path, teacher, data={"src_lang": "en", "tgt_lang": "de"})
    found = distill.teachers(cfg, TranslateOptions("cpu", beam=2), print)
    assert found.translator.target == "de" and found.translator.tag == found.translator.tokenizer.tags["de"]
    distill.distil(cfg, found, True, print)
    sources = (SAMPLE / "train.en").read_text(encoding="utf-8").splitlines()
    by_hand = Translator.from_checkpoint(teacher, TranslateOptions("cpu", beam=2)).to("de").translate(sources)
    assert (distill.folder(cfg) / "train.de").read_text(encoding="utf-8").splitlines() == [t.best for t in by_hand]
    with pytest.raises(TrainError, match="translates de->en, en->de and the data de->fr"):
        distill.teachers(_cfg(tmp_path, teacher, data={"tgt_lang": "fr"}), TranslateOptions("cpu"), print)


def test_a_student_from_its_teacher_takes_its_embeddings_and_evenly_spaced_layers(tiny_run, tmp_path):
    tiny = checkpoint.load(tiny_run.run_dir / "best")
    deep = replace(tiny.cfg, model=replace(tiny.cfg.model, N=3))
    torch.manual_seed(3)
    model = Transformer(deep.model, tiny.tokenizer.vocab_size, tiny.tokenizer.pad_id)
    teacher = checkpoint.save(tmp_path / "teacher", deep, tiny.tokenizer, model, {"step": 1})
    cfg = distill.student_config(_cfg(tmp_path, teacher, model={"N": 3, "decoder_layers": 1, "encoder_layers": 2}))
    said: list[str] = []
    started = distill.from_teacher(cfg, said.append)
    student = checkpoint.load(started.train.init)
    theirs, ours = model.state_dict(), student.model.state_dict()
    for key, value in ours.items():
        source = key.replace("encoder.layers.1.", "encoder.layers.2.")  # encoder 2 of 3: layers 0 and 2
        assert torch.equal(value, theirs[source]), key  # decoder 1 of 3: layer 0
    assert set(ours) < set(theirs) and "encoder layers [0, 2], decoder layers [0]" in said[0]
    with pytest.raises(TrainError, match="model.d_ff is 128 in the student and 64 in .* fewer layers"):
        distill.from_teacher(replace(cfg, model=replace(cfg.model, d_ff=128)), print)
    with pytest.raises(TrainError, match="the student's decoder has 4 layers and the teacher's 3; give it at most 3"):
        distill.from_teacher(replace(cfg, model=replace(cfg.model, decoder_layers=4)), print)
    with pytest.raises(TrainError, match="distill.from_teacher needs a teacher; give --teacher CHECKPOINT"):
        distill.from_teacher(replace(cfg, distill=replace(cfg.distill, teachers=[])), print)


def test_distil_from_the_teacher_through_the_command_line(tiny_run, tmp_path):
    runs, teacher = tmp_path / "runs", tiny_run.run_dir / "best"
    args = ["distill", "--config", QUICKSTART, *TINY_SETS, f"--set=run_dir={runs}", "--set=train.max_steps=3"]
    args += ["--set=train.eval_every=3", "--set=distill.from_teacher=true", "--teacher", teacher, "-q"]
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    recorded = yaml.safe_load((runs / "quickstart" / "best" / "config.yaml").read_text(encoding="utf-8"))
    assert recorded["train"]["init"] == str(runs / "quickstart-from-teacher")


def test_a_corpus_edited_between_stages_is_refused_with_how_to_start_again(tiny_run, tmp_path):
    cfg = _cfg(tmp_path, tiny_run.run_dir / "best")
    distill.distil(cfg, distill.teachers(cfg, TranslateOptions("cpu", beam=2), print), True, print)
    corpus = distill.folder(cfg) / "train.en"
    corpus.write_text(corpus.read_text(encoding="utf-8") + "an edit by hand\n", encoding="utf-8")
    with pytest.raises(TrainError, match="changed since tfm distill wrote it .* --overwrite"):
        distill.check_corpus(cfg)
    piece = distill.folder(cfg) / "piece-00001.en"
    piece.write_text("edited\n", encoding="utf-8")
    with pytest.raises(TrainError, match="piece-00001.en changed since tfm distill wrote it"):
        distill.distil(cfg, distill.teachers(cfg, TranslateOptions("cpu", beam=2), print), True, print)
    shutil.rmtree(distill.folder(cfg))
