"""``tfm score``: each (source, target) pair's log-probability under a model or an ensemble, as TSV or JSON lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cli.exits import fail
from cli.guards import check_output, check_stdout, read_pairs
from transformer.storage.files import atomic_file

if TYPE_CHECKING:
    from transformer.decoding.forced import Scored
    from transformer.decoding.translator import TranslateOptions

FORMATS = ("tsv", "jsonl")


def _row(no: int, s: Scored, pieces: list[str], fmt: str, tokens: bool) -> str:
    """One pair's line: its number, log-probability, score and BPE tokens (and each token's log-probability)."""
    if fmt == "jsonl":
        row = {"line": no, "log_prob": s.log_prob, "score": s.score, "tokens": pieces}
        return json.dumps(row | ({"token_log_probs": s.token_log_probs} if tokens else {}), ensure_ascii=False)
    cells = [str(no), f"{s.log_prob:.4f}", f"{s.score:.4f}", " ".join(pieces)]
    return "\t".join(cells + ([" ".join(f"{lp:.4f}" for lp in s.token_log_probs)] if tokens else []))


def run_score(
    checkpoints: list[Path] | None,
    src: Path,
    tgt: Path,
    output: Path | None,
    fmt: str,
    tokens: bool,
    runs: Path,
    overwrite: bool,
    options: TranslateOptions,
) -> None:
    """Score ``tgt``'s lines as translations of ``src``'s (line by line); every check comes before any work."""
    from transformer import checkpoint as ckpt
    from transformer.decoding.translator import Translator

    if fmt not in FORMATS:
        fail(f"--format takes {' or '.join(FORMATS)}, not '{fmt}'")
    sources, targets = read_pairs(src, tgt)
    paths = checkpoints or [ckpt.newest(runs)]
    read = [f for path in paths for f in ckpt.read_files(path)]
    if output is not None:
        check_output(output, overwrite, (src, tgt, *read))
    else:
        check_stdout((src, tgt, *read))
    translator = Translator.from_checkpoint(paths, options).to(options.get("to"))
    scored = translator.score(sources, targets)
    lines = [
        _row(i, s, [translator.tokenizer.id_to_token(t) or "?" for t in s.tokens], fmt, tokens)
        for i, s in enumerate(scored, 1)
    ]
    text = "".join(line + "\n" for line in lines)
    if output is None:
        sys.stdout.write(text)
    else:
        with atomic_file(output) as f:
            f.write(text)
