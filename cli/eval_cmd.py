"""``tfm eval``: translate a test set (or read hypotheses), print sacreBLEU and chrF, then save the report."""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cli.decode_flags import flag
from cli.exits import fail
from cli.guards import check_data_dir, check_folder, check_input, check_reports
from transformer.errors import WriteError
from transformer.storage import manifest
from transformer.storage.files import write_files
from transformer.text.directions import direction_data

if TYPE_CHECKING:
    from transformer.decoding.translator import TranslateOptions, Translator


def _read(path: Path) -> list[str]:
    check_input(path, "file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        fail(f"{path} line {line}: invalid UTF-8; re-encode the file as UTF-8")


@dataclass(frozen=True)
class Asked:
    """What one ``tfm eval`` command asked for, shared by every report it writes (one per direction and alpha)."""

    paths: list[Path]
    split: str | None
    src: Path | None
    ref: Path | None
    data_dir: str | None
    out_dir: Path
    alphas: list[float | None]
    options: TranslateOptions

    def reports(self, name: str, beam: int) -> list[tuple[Path, Path]]:
        """The hypotheses and scores files of the reports on ``name`` (a split, a direction of it, or a file)."""
        ensemble = f".ensemble{len(self.paths)}" if len(self.paths) > 1 else ""
        stems = [f"{name}.beam{beam}{ensemble}" + (f".alpha{a:g}" if a is not None else "") for a in self.alphas]
        return [(self.out_dir / f"{stem}.hyp", self.out_dir / f"{stem}.json") for stem in stems]

    def command(self, paths: list[Path], alpha: float | None, to: str | None) -> str:
        """The ``tfm eval`` command line that gives a report again, for the report and a model card."""
        args = ["tfm", "eval"] + [arg for path in paths for arg in ("--checkpoint", str(path))]
        o = self.options
        named = {"--split": self.split, "--src": self.src, "--ref": self.ref, flag("beam"): o.get("beam")}
        named |= {
            flag("alpha"): alpha,
            "--data-dir": self.data_dir,
            flag("to"): to,
            flag("shortlist"): o.get("shortlist"),
        }
        for option, value in named.items():
            if value is not None:
                args += [option, f"{value:g}" if isinstance(value, float) else str(value)]
        if o.precision != "fp32":
            args += ["--precision", o.precision]
        return shlex.join(args)


def _print_scores(scores) -> None:
    print(
        f"BLEU = {scores.bleu:.2f}  {scores.bleu_signature}\n"
        f"BLEU (lowercased) = {scores.bleu_lc:.2f}  {scores.bleu_lc_signature}\n"
        f"chrF = {scores.chrf:.2f}  {scores.chrf_signature}",
        flush=True,
    )


def _best(translator: Translator, sources: list[str], alphas: list[float | None]) -> list[list[str]]:
    """The 1-best translations of ``sources`` under each length penalty (None: the translator's), [alpha][line]."""
    if len(alphas) == 1:
        return [[t.best for t in translator.translate(sources)]]
    return translator.best_under(sources, alphas)


def run_eval(
    checkpoints: list[Path] | None,
    split: str | None,
    src: Path | None,
    ref: Path | None,
    hyp: Path | None,
    data_dir: str | None,
    runs: Path,
    output_dir: Path | None,
    alphas: list[float] | None,
    overwrite: bool,
    options: TranslateOptions,
    from_: str | None = None,
) -> None:
    """Print BLEU with its signature and chrF, for each direction of a multilingual model (those ``from_`` and
    ``options.get("to")`` select); write hypotheses and scores JSON to ``output_dir`` (default: the
    checkpoint's eval/). The scores are printed before anything is written, so a failed write loses no result.
    Several ``alphas`` (length penalties) are scored from one beam search, one report each. Several checkpoints
    decode as an ensemble, scored beside each of them alone; the report goes into the first one's eval/, and a model
    card leaves it out."""
    from transformer import checkpoint as ckpt
    from transformer.errors import DataError
    from transformer.scoring import score

    if hyp is not None:
        if ref is None:
            fail("--hyp needs --ref")
        if src is not None:
            fail("--hyp scores an existing file and --src translates one; give one of them")
        cfg = ckpt.read_config(checkpoints[0]) if checkpoints else None
        lang = cfg.data.tgt_lang if cfg else "en"
        _print_scores(score(_read(hyp), _read(ref), lang, cfg.decode.bleu_tokenize if cfg else None))
        return
    if output_dir is not None:
        check_folder(output_dir if output_dir.exists() else output_dir.parent, "--output-dir")
        if (kind := manifest.kind(output_dir)) not in (None, ckpt.EVAL):
            fail(
                f"--output-dir '{output_dir}' is a {kind} folder tfm wrote, not a folder of reports; leave "
                "--output-dir out (a checkpoint's reports go in its eval/) or name another folder"
            )
    from transformer.decoding.translator import Translator
    from transformer.text.corpus import load_split

    _distinct(alphas or [])
    paths = checkpoints or [ckpt.newest(runs)]
    translator = Translator.from_checkpoint(paths, options)
    asked = Asked(paths, split, src, ref, data_dir, output_dir or paths[0] / ckpt.EVAL, list(alphas or [None]), options)
    tasks: list[tuple[Translator, list[str], list[str], str]] = []  # what to translate, score and report as
    if src is not None and ref is not None:
        sources, references = _read(src), _read(ref)
        if len(sources) != len(references):
            fail(f"{src} has {len(sources)} lines but {ref} has {len(references)}; give one reference per source line")
        tasks.append((translator.to(options.get("to")), sources, references, src.name))  # a model of several needs --to
    else:
        check_data_dir(data_dir, translator.cfg.data.format)
        data = dataclasses.replace(translator.cfg.data, path=data_dir) if data_dir else translator.cfg.data
        name = split or data.test_split
        for source, target in _directions(data.pairs(), from_, options.get("to")):
            one = direction_data(data, source, target)
            try:
                corpus = load_split(one, name)
            except DataError as e:
                raise DataError(
                    f"{e} (the corpus is looked for where the checkpoint was trained: data.path "
                    f"'{one.path}'; pass --data-dir to read it elsewhere)"
                ) from None
            report = f"{name}.{source}-{target}" if data.tagged else name
            tasks.append((translator.to(target), list(corpus.src), list(corpus.tgt), report))
    files = [f for t in tasks for pair in asked.reports(t[3], t[0].decode.beam) for f in pair]
    check_reports(files, overwrite, (*[f for path in paths for f in ckpt.read_files(path)], src, ref))
    for task in tasks:
        if len(tasks) > 1:
            print(f"{task[3]}:")
        _evaluate(*task, asked)


def _distinct(alphas: list[float]) -> None:
    """Length penalties that name reports of their own (a report is named for its alpha to 6 significant digits)."""
    named: dict[str, float] = {}
    for a in alphas:
        if (first := named.setdefault(f"{a:g}", a)) != a:
            fail(
                f"--alpha {first!r} and --alpha {a!r} name the same report (alpha{a:g}); give penalties that differ "
                "in their first 6 significant digits"
            )


def _directions(pairs: list[tuple[str, str]], from_: str | None, to: str | None) -> list[tuple[str, str]]:
    """The model's directions that ``--from`` and ``--to`` select (all of them without either). Both given, a pair the
    model never trained is evaluated zero-shot when it reads the source language and writes the target one."""
    chosen = [(s, t) for s, t in pairs if from_ in (None, s) and to in (None, t)]
    if not chosen and from_ in {s for s, _ in pairs} and to in {t for _, t in pairs} and from_ != to:
        print(f"zero-shot: the model never trained {from_}-{to}; it reads {from_} and writes {to} in other directions")
        return [(from_, to)]  # type: ignore[list-item]
    if not chosen:
        known = ", ".join(f"{s}-{t}" for s, t in pairs)
        fail(f"the model translates {known}; no direction matches --from {from_ or 'any'} --to {to or 'any'}")
    return chosen


def _evaluate(translator: Translator, sources: list[str], references: list[str], name: str, asked: Asked) -> None:
    """Translate ``sources`` with ``translator``, print each alpha's scores against ``references`` and save the
    reports on ``name``."""
    from transformer import checkpoint as ckpt
    from transformer.scoring import score

    cfg, decode, alphas = translator.cfg, translator.decode, asked.alphas
    tgt_lang = translator.target or cfg.data.tgt_lang
    to = translator.target if cfg.data.tagged else None
    reports = asked.reports(name, decode.beam)
    ensemble = len(asked.paths) > 1
    hyps_per_alpha = _best(translator, sources, alphas)
    members = [_best(alone, sources, alphas) for alone in translator.alone()] if ensemble else []
    results = []
    for i, (alpha, hyps) in enumerate(zip(alphas, hyps_per_alpha)):
        scores = score(hyps, references, tgt_lang, decode.bleu_tokenize)
        if len(alphas) > 1:
            print(f"alpha {alpha:g}:")
        _print_scores(scores)
        result = {
            "checkpoint": str(asked.paths[0]),
            "split": name,
            "beam": decode.beam,
            "alpha": decode.alpha if alpha is None else alpha,
            "precision": translator.precision,
            **scores.as_dict(),
            "command": asked.command(asked.paths, alpha, to),
        }
        if ensemble:
            result["members"] = []
            for path, member in zip(asked.paths, members):
                alone = score(member[i], references, tgt_lang, decode.bleu_tokenize)
                command = asked.command([path], alpha, to)
                print(f"  alone: BLEU = {alone.bleu:.2f}  chrF = {alone.chrf:.2f}  {command}", flush=True)
                result["members"].append({"checkpoint": str(path), **alone.as_dict(), "command": command})
        results.append(result)
    texts = {}
    for (hyp_file, json_file), hyps, result in zip(reports, hyps_per_alpha, results):
        texts[hyp_file.name] = "".join(h + "\n" for h in hyps)
        texts[json_file.name] = json.dumps(result, indent=2)
    try:
        write_files(asked.out_dir, texts, ckpt.EVAL)
    except WriteError as e:
        fail(f"{e} (the scores above are complete; pass --output-dir to save the report elsewhere)")
    if len(alphas) > 1:
        top = max(results, key=lambda r: r["bleu"])
        print(f"highest BLEU on {name}: alpha {top['alpha']:g} ({top['bleu']:.2f})")
    print(f"hypotheses and scores in {asked.out_dir}/")
