"""Sequence-level knowledge distillation (Kim and Rush, 2016; ``tfm distill``): a teacher (one model or an ensemble)
translates the training sources, and a student, usually much smaller, learns from those translations.

The distilled corpus is an ordinary ``text`` corpus a user can inspect and reuse, in a folder beside the student's
run (``<run_dir>/<name>-distilled``): ``train.{src}`` (the sources) and ``train.{tgt}`` (the teacher's translations,
with the real pairs after them under ``distill.with_real``), and the real valid and test splits. It is translated in
pieces of ``distill.piece_lines`` lines, each written whole and recorded (``recipe.json``: the teachers' weights,
the source text and the decode settings, and each piece's SHA-256), so a killed run goes on where it stopped and
never translates a finished piece twice; a recipe that differs, or a piece or corpus changed since it was written,
is refused in one line saying how to start again. The student takes the teacher's tokenizer (``tokenizer.path``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

from transformer import checkpoint
from transformer.config import Config, TokenizerConfig
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.errors import TrainError
from transformer.model.transformer import Transformer
from transformer.storage import manifest
from transformer.storage.files import atomic_file
from transformer.text.corpus import Corpus, load_split
from transformer.training import init

KIND = "distilled"  # what the corpus folder is recorded as
RECIPE = "recipe.json"


@dataclass
class Teachers:
    """The teachers' checkpoints as a translator of the student's training sources, and what identifies them."""

    translator: Translator
    fingerprints: list[str]


def folder(cfg: Config) -> Path:
    """Where the student's distilled corpus goes: ``<run_dir>/<name>-distilled``."""
    return Path(cfg.run_dir) / f"{cfg.name}-distilled"


def student_config(cfg: Config) -> Config:
    """The student's config: its data the distilled corpus (text, its real valid and test splits beside), its
    tokenizer the first teacher's."""
    d = cfg.data
    data = replace(
        d,
        format="text",
        path=str(folder(cfg)),
        train_split="train",
        valid_split="valid",
        test_split="test",
        holdout=None,
        hf_config=None,
        hf_field=None,
        tsv_columns=None,
    )
    tokenizer = replace(cfg.tokenizer, path=str(Path(cfg.distill.teachers[0]) / checkpoint.TOKENIZER))
    return replace(cfg, data=data, tokenizer=tokenizer)


def teachers(cfg: Config, options: TranslateOptions, log: Callable[[str], None]) -> Teachers:
    """The teachers of ``cfg.distill``, checked against the student: they translate the run's language pair (a
    multilingual teacher among its directions, with its target's tag), and the student asks for their tokenizer's
    settings (it takes their tokenizer); a student bigger than the teacher is said, not refused."""
    paths = [Path(p) for p in cfg.distill.teachers]
    if not paths:
        raise TrainError("no teacher to distil from; give --teacher CHECKPOINT (repeat it for an ensemble)")
    first = checkpoint.load(paths[0], "cpu")
    pair, theirs = (cfg.data.src_lang, cfg.data.tgt_lang), first.cfg.data.pairs()
    if pair not in theirs:
        raise TrainError(
            f"the teacher {paths[0]} translates {', '.join('->'.join(p) for p in theirs)} and the data "
            f"{'->'.join(pair)}; distil from a teacher of the run's language pair"
        )
    ours, yours = _settings(cfg.tokenizer), _settings(first.cfg.tokenizer)
    if ours != yours:
        key = next(k for k in ours if ours[k] != yours[k])
        raise TrainError(
            f"the student takes its teacher's tokenizer, and its config asks for another (tokenizer.{key} "
            f"{ours[key]} here, {yours[key]} in {paths[0]}); set the config's tokenizer as the teacher's"
        )
    student = sum(p.numel() for p in _shape_only(cfg, first).parameters())
    teacher = sum(p.numel() for p in first.model.parameters())
    if student > teacher:
        log(f"note: the student ({student:,} parameters) is bigger than its teacher ({teacher:,}); distilling anyway")
    translator = Translator.from_checkpoint(paths, options).to(cfg.data.tgt_lang if first.cfg.data.tagged else None)
    fingerprints = [hashlib.sha256((p / checkpoint.WEIGHTS).read_bytes()).hexdigest() for p in paths]
    return Teachers(translator, fingerprints)


def from_teacher(cfg: Config, log: Callable[[str], None]) -> Config:
    """The student's config ``cfg`` (student_config's) starting from its first teacher (``distill.from_teacher``:
    shrink and fine-tune, Shleifer and Rush 2020): the teacher's embeddings and, of each stack, evenly spaced layers
    (the first always), written as a checkpoint ``<run_dir>/<name>-from-teacher`` that becomes ``train.init``. The
    student's shape must be the teacher's but for fewer layers."""
    if not cfg.distill.teachers:
        raise TrainError("distill.from_teacher needs a teacher; give --teacher CHECKPOINT")
    teacher = checkpoint.load(cfg.distill.teachers[0])
    ours, theirs = cfg.model, teacher.cfg.model
    if conflicts := init.shape_conflicts(ours, theirs):
        name, a, b = conflicts[0]
        raise TrainError(
            f"distill.from_teacher: model.{name} is {a} in the student and {b} in {teacher.path}; a student starts "
            "from its teacher with its shape but fewer layers: set it as the teacher's or distill.from_teacher: false"
        )
    picks = {}
    for stack, n, m in zip(("encoder", "decoder"), ours.depths, theirs.depths):
        if n > m:
            raise TrainError(
                f"distill.from_teacher: the student's {stack} has {n} layers and the teacher's {m}; give it at most "
                f"{m}, or set distill.from_teacher: false"
            )
        picks[stack] = [0] if n == 1 else [round(k * (m - 1) / (n - 1)) for k in range(n)]
    model = Transformer(ours, teacher.tokenizer.vocab_size, teacher.tokenizer.pad_id)
    weights = teacher.model.state_dict()

    def source(key: str) -> str:
        stack, _, rest = key.partition(".layers.")
        if not rest:
            return key
        layer, _, name = rest.partition(".")
        return f"{stack}.layers.{picks[stack][int(layer)]}.{name}"

    model.load_state_dict({key: weights[source(key)] for key in model.state_dict()})
    path = Path(cfg.run_dir) / f"{cfg.name}-from-teacher"
    meta = {"step": 0, "from_teacher": {"path": str(teacher.path), "layers": picks}}
    checkpoint.save(path, cfg, teacher.tokenizer, model, meta)
    log(f"the student starts from {teacher.path}: encoder layers {picks['encoder']}, decoder layers {picks['decoder']}")
    return replace(cfg, train=replace(cfg.train, init=str(path)))


def _settings(t: TokenizerConfig) -> dict:
    """What a tokenizer section asks for, but where it is read from."""
    return {k: v for k, v in asdict(t).items() if k != "path"}


def _shape_only(cfg: Config, teacher: checkpoint.Loaded):
    """The student's model on the meta device (its parameter count, nothing allocated)."""
    import torch

    from transformer.model.transformer import Transformer

    with torch.device("meta"):
        return Transformer(cfg.model, teacher.tokenizer.vocab_size, teacher.tokenizer.pad_id)


def distil(cfg: Config, found: Teachers, quiet: bool, log: Callable[[str], None]) -> Path:
    """Translate the training sources with the teachers into ``folder(cfg)``, piece by piece, resuming where an earlier
    run stopped, then write the corpus; its folder."""
    d, out = cfg.data, folder(cfg)
    train, valid, test = (load_split(d, split) for split in (d.train_split, d.valid_split, d.test_split))
    decode = found.translator.decode
    recipe = {
        "teachers": [{"path": t, "sha256": f} for t, f in zip(cfg.distill.teachers, found.fingerprints)],
        "source": {"split": d.train_split, "lines": len(train), "sha256": _sha256(train.src)},
        "decode": {
            "beam": decode.beam,
            "alpha": decode.alpha,
            "max_len_a": decode.max_len_a,
            "max_len_b": decode.max_len_b,
        },
        "languages": [d.src_lang, d.tgt_lang],
        "piece_lines": cfg.distill.piece_lines,
    }
    done = _pieces_done(out, recipe)
    n, size = len(train), cfg.distill.piece_lines
    with tqdm(total=n, initial=min(len(done) * size, n), unit="line", disable=quiet, desc="distil") as bar:
        for k, start in enumerate(range(0, n, size)):
            if k < len(done):
                continue
            translations = found.translator.translate(list(train.src[start : start + size]), chunk=size)
            lines = [t.best.replace("\n", " ").replace("\r", " ") for t in translations]  # one line each
            text = "".join(line + "\n" for line in lines)
            name = f"piece-{k:05d}.{d.tgt_lang}"
            with atomic_file(out / name) as f:
                f.write(text)
            manifest.record(out, name, kind_=KIND)
            done.append(hashlib.sha256(text.encode("utf-8")).hexdigest())
            _write_recipe(out, {**recipe, "pieces": done})
            bar.update(min(size, n - start))
    translated = [line for k in range(len(done)) for line in _read(out / f"piece-{k:05d}.{d.tgt_lang}")]
    sources, targets = list(train.src), translated
    if cfg.distill.with_real:
        sources, targets = sources + list(train.src), targets + list(train.tgt)
    files = {
        f"train.{d.src_lang}": sources,
        f"train.{d.tgt_lang}": targets,
        f"valid.{d.src_lang}": list(valid.src),
        f"valid.{d.tgt_lang}": list(valid.tgt),
        f"test.{d.src_lang}": list(test.src),
        f"test.{d.tgt_lang}": list(test.tgt),
    }
    for name, rows in files.items():
        with atomic_file(out / name) as f:
            f.write("".join(row + "\n" for row in rows))
    manifest.record(out, *files, kind_=KIND)
    corpus = {name: _sha256(rows) for name, rows in files.items()}
    _write_recipe(out, {**recipe, "pieces": done, "corpus": corpus})
    log(
        f"distilled corpus: {len(sources):,} training pairs in {out} ({len(train):,} translated by the teacher"
        + (f", {len(train):,} real" if cfg.distill.with_real else "")
        + ")"
    )
    return out


def check_corpus(cfg: Config) -> None:
    """Before the student trains on it: the distilled corpus is there, whole, and as it was written."""
    out = folder(cfg)
    recipe = _recipe(out)
    corpus = (recipe or {}).get("corpus")
    if corpus is None:
        raise TrainError(f"{out} holds no finished distilled corpus; run tfm distill with --stage translate first")
    for name, sha in corpus.items():
        if not (out / name).is_file() or _sha256(_read(out / name)) != sha:
            raise TrainError(
                f"{out / name} changed since tfm distill wrote it (its SHA-256 differs); to distil again, run "
                f"tfm distill with --overwrite, or restore the file"
            )


def _pieces_done(out: Path, recipe: dict) -> list[str]:
    """The SHA-256 of each piece an earlier run of the same recipe finished; a folder of another recipe, or a piece
    changed since, is refused."""
    kept = _recipe(out)
    if kept is None:
        if out.exists() and any(out.iterdir()):
            if manifest.kind(out) != KIND:
                raise TrainError(f"{out} holds files tfm did not write; move them, or choose another --set name=")
        out.mkdir(parents=True, exist_ok=True)
        manifest.create(out, KIND)
        return []
    if {k: v for k, v in kept.items() if k not in ("pieces", "corpus")} != recipe:
        raise TrainError(
            f"{out} was distilled from other teachers, sources or settings; to start again, run tfm distill with "
            "--overwrite (or --set name= for another run)"
        )
    pieces = list(kept.get("pieces", []))
    for k, sha in enumerate(pieces):
        path = out / f"piece-{k:05d}.{recipe['languages'][1]}"
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            raise TrainError(
                f"{path} changed since tfm distill wrote it (its SHA-256 differs); to start again, run tfm distill "
                "with --overwrite"
            )
    return pieces


def _recipe(out: Path) -> dict | None:
    try:
        return json.loads((out / RECIPE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_recipe(out: Path, recipe: dict) -> None:
    with atomic_file(out / RECIPE) as f:
        f.write(json.dumps(recipe, indent=1) + "\n")
    manifest.record(out, RECIPE, kind_=KIND)


def _read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def _sha256(rows: Sequence[str] | Corpus) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(row.encode("utf-8") + b"\n")
    return h.hexdigest()
