"""``tfm eval``: translate a test set (or read hypotheses), score with sacrebleu, save beside the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from cli.errors import fail


def _read(path: Path) -> list[str]:
    if not path.is_file():
        fail(f"file '{path}' not found; pass an existing file with one sentence per line")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        fail(f"{path} line {line}: invalid UTF-8; re-encode the file as UTF-8")


def run_eval(checkpoint: Path | None, split: str | None, src: Path | None, ref: Path | None, hyp: Path | None,
             beam: int | None, data_dir: str | None, device: str, precision: str, runs: Path) -> None:
    """Print BLEU with its signature and chrF; write hypotheses and scores JSON beside the checkpoint."""
    from transformer import checkpoint as ckpt
    from transformer.evaluate import score

    if hyp is not None:
        if ref is None:
            fail("--hyp needs --ref")
        cfg = ckpt.read_config(checkpoint) if checkpoint is not None else None
        lang = cfg.data.tgt_lang if cfg else "en"
        scores = score(_read(hyp), _read(ref), lang, cfg.decode.bleu_tokenize if cfg else None)
        print(f"BLEU = {scores.bleu:.2f}  {scores.bleu_signature}\nchrF = {scores.chrf:.2f}  {scores.chrf_signature}")
        return
    from transformer.corpus import load_split
    from transformer.device import check_precision, resolve_device
    from transformer.translator import Translator

    dev = resolve_device(device)
    check_precision(precision, dev)
    path = checkpoint or ckpt.newest(runs)
    loaded = ckpt.load(path, dev)
    cfg = loaded.cfg
    if src is not None and ref is not None:
        sources, references, name = _read(src), _read(ref), src.name
        if len(sources) != len(references):
            fail(f"{src} has {len(sources)} lines but {ref} has {len(references)}; give one reference per source line")
    else:
        if data_dir:
            cfg.data.path = data_dir
        name = split or cfg.data.test_split
        corpus = load_split(cfg.data, name)
        sources, references = list(corpus.src), list(corpus.tgt)
    beam = beam or cfg.decode.beam
    translator = Translator(loaded.model, loaded.tokenizer, cfg.decode, cfg.model.max_positions, dev, precision)
    hyps = [t.best for t in translator.translate(sources, beam)]
    scores = score(hyps, references, cfg.data.tgt_lang, cfg.decode.bleu_tokenize)
    out_dir = path / "eval"
    out_dir.mkdir(exist_ok=True)
    (out_dir / f"{name}.beam{beam}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    result = {"checkpoint": str(path), "split": name, "beam": beam, **scores.as_dict()}
    (out_dir / f"{name}.beam{beam}.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"BLEU = {scores.bleu:.2f}  {scores.bleu_signature}\nchrF = {scores.chrf:.2f}  {scores.chrf_signature}")
    print(f"hypotheses and scores in {out_dir}/")
