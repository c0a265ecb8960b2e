"""Issue 59's models on one GPU, in one call: a teacher ensemble, students distilled from it, each chosen on val.

Stage 1 trains the TEACHERS side by side for ``--minutes`` each (the multi30k-de-en-gpu recipe from three seeds) and
averages each one's last 3 checkpoints. The three averages translate val as an ensemble at every length penalty of
ALPHAS (one beam search), and at the penalty val chose they translate the 29,000 training sources once (``tfm
distill --stage translate``, beam 5), the real pairs beside them (``distill.with_real``). Stage 2 trains the
STUDENTS side by side on copies of that corpus for ``--student-minutes`` each (multi30k-de-en-student at several
encoder depths over one decoder layer, each started from the first teacher's layers) and averages each one's last 3.
Every model's checkpoint (best/ or the average) and penalty are chosen on val and only then read on test: each
teacher's, the ensemble's, each student's. Figures go to ``<out>/gpu-student.json`` after each stage, the runs' logs
and reports to ``<out>/runs.tgz``, and the models a CPU then times (``python -m bench.run --sections student``) to
``<out>/models.tar.NN``, pieces of at most PIECE bytes (``cat models.tar.* | tar -x``): the first teacher, which has
the recipe's shape, and the students that fit beside it (PACKED in all), each chosen checkpoint with its penalty in
its config, each student with a shortlist of its own corpus beside it (``<student>.shortlist``: ``tfm shortlist``).

    python -m bench.gpu_student --data data/multi30k --out $OUT     # on the GPU: 9 minutes estimated, not yet run
    python -m bench.gpu_student --device cpu --quick --out /tmp/s           # checks it runs (pytest -m slow)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from datetime import date
from pathlib import Path

import torch

from bench.common import DEFAULT_DATA, ROOT, machine
from bench.recipe_search import (
    average,
    averaged,
    choose,
    evaluate,
    pack_logs,
    run_summary,
    tfm_process,
    wait_all,
    write_chosen,
)
from transformer import checkpoint
from transformer.config_file import load
from transformer.training import distill

TEACHER = "multi30k-de-en-gpu"
STUDENT = "multi30k-de-en-student"
TEACHERS = {"seed1": "seed=1", "seed2": "seed=2", "seed3": "seed=3"}
STUDENTS = {  # by priority: what is packed first (the shape whose int8 rows the issue measured short)
    "student-2-1": "model.encoder_layers=2",
    "student-1-1": "model.encoder_layers=1",
    "student-3-1": "model.encoder_layers=3",
}
CORPUS = "corpus"  # the run whose distilled corpus the students copy
SHORTLIST = "shortlist"  # <student>.shortlist: each packed student's lexical shortlist, beside its folder
ALPHAS = (1.0, 2.0, 3.0, 4.0)
AVERAGE = 3
PIECE = 15 * 2**20  # under the 16 MiB a file the device machine gives back
PACKED = 56 * 2**20  # the models' share of the 64 MiB it gives back in all
GPU = [  # time (--minutes) or early stopping ends a run; validation greedy on 400 sentences, a small share of it
    *("train.max_steps=100000", "train.eval_every=500", "train.eval_sentences=400", "train.save_every=500"),
    *("train.keep_last=10", "train.patience=8", "decode.batch_tokens=16384"),
]
QUICK = [  # 4 updates, outputs of 5 tokens at most: only that every stage runs
    *("train.max_steps=4", "train.eval_every=2", "train.save_every=1", "train.keep_last=5"),
    *("train.eval_sentences=4", "decode.max_len_a=0", "decode.max_len_b=5", "tokenizer.vocab_size=300"),
]
QUICK_TEACHERS = ("seed1", "seed2")
QUICK_STUDENTS = ("student-2-1",)
QUICK_ALPHAS = (1.0, 3.0)


def _sets(pairs: list[str]) -> list[str]:
    """``--set`` before each override."""
    return [a for s in pairs for a in ("--set", s)]


def _common(name: str, runs: Path, minutes: float, args: argparse.Namespace) -> list[str]:
    """The overrides every run takes: its name and folder, the device, its minutes, the GPU's or quick settings."""
    return [f"name={name}", f"run_dir={runs}", f"device={args.device}", f"train.max_minutes={minutes}"] + (
        QUICK if args.quick else GPU
    )


def _train_teacher(name: str, sets: str, runs: Path, args: argparse.Namespace) -> subprocess.Popen:
    """``tfm train`` of a teacher (TEACHER with ``sets``) for ``--minutes``, in a process of its own."""
    command = ["train", "--config", TEACHER, "--data-dir", args.data, "--quiet", "--overwrite"]
    overrides = _common(name, runs, args.minutes, args) + [sets]
    return tfm_process(command + _sets(overrides), runs / f"{name}.train.txt", args.threads)


def _distill(
    name: str, stage: str, sets: list[str], teachers: list[Path], runs: Path, args: argparse.Namespace
) -> subprocess.Popen:
    """``tfm distill --stage <stage>`` of a student ``name`` (STUDENT with ``sets``) from ``teachers``, the real
    pairs beside their translations, in a process of its own."""
    command = ["distill", "--config", STUDENT, "--data-dir", args.data, "--stage", stage, "--device", args.device]
    command += [*(a for t in teachers for a in ("--teacher", str(t))), "--quiet"]
    overrides = _common(name, runs, args.student_minutes, args) + ["distill.with_real=true", *sets]
    return tfm_process(command + _sets(overrides), runs / f"{name}.{stage}.txt", args.threads)


def _candidates(names: list[str], runs: Path) -> dict[str, Path]:
    """Each run's checkpoints that compete on val, by ``<run>.<best|avgK>``: those that exist."""
    found = {f"{n}.best": runs / n / "best" for n in names}
    found |= {f"{n}.avg{AVERAGE}": averaged(runs, n, AVERAGE) for n in names}
    return {name: path for name, path in found.items() if (path / checkpoint.META).is_file()}


def _chosen(
    names: list[str], candidates: dict[str, Path | list[Path]], runs: Path, data: str, args: argparse.Namespace
) -> dict[str, dict]:
    """For each run of ``names`` (a run's candidates are ``<run>.*`` of ``candidates``), its checkpoint and penalty
    chosen on val, and its test scores there; with every candidate's val BLEU by penalty. The chosen checkpoints
    translate test at every penalty together (one beam search serves them all), and each is read at its own."""
    alphas = list(QUICK_ALPHAS if args.quick else ALPHAS)
    val = evaluate(runs, candidates, "valid", data, args.device, args.threads, alphas)
    result, picked = {}, {}
    for n in names:
        mine = {ck: scores for ck, scores in val.items() if ck.split(".", 1)[0] == n}
        result[n] = {"val": {ck: {str(a): s["bleu"] for a, s in by.items()} for ck, by in mine.items()}}
        if (choice := choose(mine)) is not None:
            picked[n] = choice
    test = evaluate(
        runs, {ck: candidates[ck] for ck, _, _ in picked.values()}, "test", data, args.device, args.threads, alphas
    )
    for n, (ck, alpha, bleu) in picked.items():
        result[n]["chosen_on_val"] = {"checkpoint": ck, "alpha": alpha, "val_bleu": bleu, "test": test[ck][alpha]}
    return result


def _trained(run: Path, code: int) -> dict:
    """A finished run's updates, minutes and validation curve (nothing for one that failed: its console says why)."""
    return run_summary(run, None) if code == 0 else {}


def _pack(models: list[Path], out: Path) -> list[str]:
    """The folders and files ``models`` as one tar archive, cut into pieces ``models.tar.00``, ... of at most PIECE
    bytes."""
    archive = out / "models.tar"
    with tarfile.open(archive, "w") as tar:
        for path in models:
            tar.add(path, arcname=path.name)
    pieces = []
    with open(archive, "rb") as whole:
        while chunk := whole.read(PIECE):
            piece = out / f"models.tar.{len(pieces):02d}"
            piece.write_bytes(chunk)
            pieces.append(piece.name)
    archive.unlink()
    return pieces


def _corpus(name: str, runs: Path) -> Path:
    """The distilled corpus folder of the student run ``name`` (distill.folder)."""
    return distill.folder(load(STUDENT, [f"name={name}", f"run_dir={runs}"]))


def _size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="the Multi30k folder (--data-dir of every run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--minutes", type=float, default=3.0, help="training minutes of each teacher")
    p.add_argument("--student-minutes", type=float, default=2.5, help="training minutes of each student")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per process")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "gpu_student")
    p.add_argument("--out", type=Path, required=True, help="folder for gpu-student.json, runs.tgz and the models")
    p.add_argument("--quick", action="store_true", help="two teachers and one student, 4 updates each")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    runs, out = args.runs, args.out
    teachers = {n: s for n, s in TEACHERS.items() if not args.quick or n in QUICK_TEACHERS}
    students = {n: s for n, s in STUDENTS.items() if not args.quick or n in QUICK_STUDENTS}
    gpu = torch.cuda.get_device_name() if args.device == "cuda" and torch.cuda.is_available() else None
    result: dict = {
        "date": date.today().isoformat(),
        "machine": {**machine(), "gpu": gpu},
        "command": "python -m bench.gpu_student " + " ".join(sys.argv[1:] if argv is None else argv),
        "minutes": {"teachers": args.minutes, "students": args.student_minutes},
        "teachers": {},
        "students": {},
    }

    def save() -> None:
        (out / "gpu-student.json").write_text(json.dumps(result, indent=1) + "\n")
        pack_logs(runs, out)

    codes = wait_all({n: _train_teacher(n, s, runs, args) for n, s in teachers.items()})
    for n, sets in teachers.items():
        result["teachers"][n] = {"set": [sets], "exit_code": codes[n], **_trained(runs / n, codes[n])}
    save()
    trained = [n for n in teachers if codes[n] == 0]
    if len(trained) < 2:
        sys.exit(f"fewer than two teachers trained ({', '.join(trained) or 'none'}); their consoles in {runs}")
    average(runs, trained, [AVERAGE], args.threads)
    members = [averaged(runs, n, AVERAGE) for n in trained]
    candidates: dict[str, Path | list[Path]] = {**_candidates(trained, runs), "ensemble.avg": members}
    chosen = _chosen([*trained, "ensemble"], candidates, runs, args.data, args)
    for n in trained:
        result["teachers"][n] |= chosen[n]
    result["ensemble"] = {"members": [str(m) for m in members], **chosen["ensemble"]}
    save()
    alpha = chosen["ensemble"]["chosen_on_val"]["alpha"]
    corpus = _corpus(CORPUS, runs)
    translated = _distill(CORPUS, "translate", [f"distill.alpha={alpha}"], members, runs, args).wait()
    result["corpus"] = {"alpha": alpha, "exit_code": translated, "folder": str(corpus)}
    save()
    if translated != 0:
        sys.exit(f"the teachers' translation failed; its console: {runs / f'{CORPUS}.translate.txt'}")
    for n in students:  # each student's corpus folder a copy: nothing is translated twice
        shutil.copytree(corpus, _corpus(n, runs), dirs_exist_ok=True)
    common = [f"distill.alpha={alpha}"]
    codes = wait_all({n: _distill(n, "train", [*common, s], members, runs, args) for n, s in students.items()})
    for n, sets in students.items():
        result["students"][n] = {"set": [*common, sets], "exit_code": codes[n], **_trained(runs / n, codes[n])}
    save()
    done = [n for n in students if codes[n] == 0]
    average(runs, done, [AVERAGE], args.threads)
    for n, scores in _chosen(done, _candidates(done, runs), runs, str(corpus), args).items():
        result["students"][n] |= scores
    save()
    result["packed"] = _ship(result, runs, out, trained[0], done, args)
    save()
    print(json.dumps({n: r.get("chosen_on_val") for n, r in result["students"].items()}, indent=1))
    return result


def _ship(result: dict, runs: Path, out: Path, teacher: str, students: list[str], args: argparse.Namespace) -> dict:
    """The first teacher and the students that fit beside it (STUDENTS' order), each at its choice on val with a
    shortlist of the corpus, as models.tar pieces; what went in."""
    ready = out / "models"
    shutil.rmtree(ready, ignore_errors=True)
    ready.mkdir()
    picks = [(teacher, result["teachers"][teacher]), *((n, result["students"][n]) for n in students)]
    models, total = [], 0
    for name, run in picks:
        if "chosen_on_val" not in run:
            continue
        chosen = run["chosen_on_val"]
        folder = write_chosen(_candidates([name], runs)[chosen["checkpoint"]], chosen["alpha"], ready / name, chosen)
        files = [folder]
        if name != teacher:
            listed = ready / f"{name}.{SHORTLIST}"
            command = ["shortlist", "--checkpoint", str(folder), "--data-dir", str(_corpus(name, runs))]
            command += ["--output", str(listed)]
            if tfm_process(command, runs / f"{name}.shortlist.txt", args.threads).wait() == 0:
                files.append(listed)
        size = sum(_size(f) for f in files)
        if total + size <= PACKED:
            models += files
            total += size
    pieces = _pack(models, out)
    shutil.rmtree(ready)
    return {"files": [m.name for m in models], "bytes": total, "pieces": pieces}


if __name__ == "__main__":
    main()
