"""bench.gpu_student: every teacher and student is a config tfm accepts, the models come back in pieces that join
into one archive, and every stage runs on the CPU."""

import io
import json
import tarfile
from pathlib import Path

import pytest

from bench import gpu_student
from bench.gpu_student import GPU, QUICK_ALPHAS, QUICK_STUDENTS, QUICK_TEACHERS, STUDENT, STUDENTS, TEACHER, TEACHERS
from transformer import checkpoint
from transformer.config_file import load
from transformer.decoding.translator import TranslateOptions, Translator


def test_every_teacher_and_student_is_a_config_tfm_accepts():
    for name, sets in TEACHERS.items():
        assert load(TEACHER, [*GPU, sets]).train.max_steps == 100000, name
    for name, sets in STUDENTS.items():
        cfg = load(STUDENT, [*GPU, sets, "distill.with_real=true"])
        assert cfg.model.depths[1] == 1 and cfg.distill.from_teacher, name


def test_the_pieces_join_into_the_archive_of_the_models(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(gpu_student, "PIECE", 1000)
    model = tmp_path / "m"
    model.mkdir()
    (model / "weights").write_bytes(bytes(range(256)) * 20)
    (tmp_path / "m.shortlist").write_bytes(b"x" * 3000)
    out = tmp_path / "out"
    out.mkdir()
    pieces = gpu_student._pack([model, tmp_path / "m.shortlist"], out)
    assert len(pieces) > 8 and all((out / p).stat().st_size <= 1000 for p in pieces)
    assert not (out / "models.tar").exists()
    joined = b"".join((out / p).read_bytes() for p in pieces)
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        assert sorted(tar.getnames()) == ["m", "m.shortlist", "m/weights"]
        assert tar.extractfile("m/weights").read() == (model / "weights").read_bytes()


@pytest.mark.slow
def test_teachers_ensemble_corpus_and_students_on_the_cpu(small_multi30k: Path, tmp_path: Path, monkeypatch):
    """--quick: both teachers train and decode together, they translate the corpus once, the student trains on a
    copy of it from the first teacher's layers, every choice is the highest val BLEU with test read at it, and the
    packed student translates with its shortlist at its chosen penalty."""
    monkeypatch.delenv("TFM_MULTI30K")  # it outranks --data-dir, and the runs read the small copy
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["--data", str(small_multi30k), "--device", "cpu", "--quick", "--runs", str(runs), "--out", str(out)]
    result = gpu_student.main([*args, "--minutes", "2", "--student-minutes", "2"])
    assert list(result["teachers"]) == list(QUICK_TEACHERS) and list(result["students"]) == list(QUICK_STUDENTS)
    for run in [*result["teachers"].values(), result["ensemble"], *result["students"].values()]:
        chosen = run["chosen_on_val"]
        assert chosen["val_bleu"] == max(b for by in run["val"].values() for b in by.values())
        assert chosen["alpha"] in QUICK_ALPHAS and chosen["test"]["alpha"] == chosen["alpha"]
    assert result["ensemble"]["members"] == [str(runs / f"{n}.avg3") for n in QUICK_TEACHERS]
    assert (
        result["corpus"]["exit_code"] == 0 and result["corpus"]["alpha"] == result["ensemble"]["chosen_on_val"]["alpha"]
    )
    student = QUICK_STUDENTS[0]
    assert result["students"][student]["exit_code"] == 0 and result["students"][student]["updates"] == 4
    corpus = runs / f"{student}-distilled"
    assert (corpus / "train.en").read_text() == (runs / "corpus-distilled" / "train.en").read_text()
    trained = checkpoint.read_config(runs / student / "best")
    assert trained.data.path == str(corpus) and trained.train.init == str(runs / f"{student}-from-teacher")
    assert json.loads((out / "gpu-student.json").read_text())["packed"] == result["packed"]
    assert result["packed"]["files"] == [QUICK_TEACHERS[0], student, f"{student}.shortlist"]
    joined = b"".join((out / p).read_bytes() for p in result["packed"]["pieces"])
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        tar.extractall(tmp_path / "back", filter="data")
    back = tmp_path / "back" / student
    assert checkpoint.read_config(back).decode.alpha == result["students"][student]["chosen_on_val"]["alpha"]
    shortlist = str(tmp_path / "back" / f"{student}.shortlist")
    translator = Translator.from_checkpoint(back, TranslateOptions("cpu", "int8", shortlist=shortlist))
    assert len(list(translator.translate(["Ein Mann fährt Fahrrad."]))) == 1
