"""BLEU and chrF through sacrebleu, on detokenized text against untouched references.

Training-time validation and ``tfm eval`` both score through ``score`` so the two
numbers are the same kind of number. The BLEU tokenizer follows the target
language (``zh`` for Chinese, ``ja-mecab`` is left to the user, ``13a`` otherwise)
unless the config names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import sacrebleu

from transformer.errors import EvalError


@dataclass
class Scores:
    """One evaluation: corpus BLEU, chrF and the signatures that make them reproducible."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int

    def as_dict(self) -> dict[str, float | str | int]:
        """Plain values for JSON files and logs."""
        return dict(self.__dict__)


def bleu_tokenizer(tgt_lang: str, override: str | None = None) -> str:
    """sacrebleu's tokenizer for a target language: 'zh' for Chinese, '13a' otherwise."""
    if override:
        return override
    return "zh" if tgt_lang.lower().split("-")[0] in ("zh", "cmn", "yue") else "13a"


def score(hypotheses: Sequence[str], references: Sequence[str], tgt_lang: str, tokenize: str | None = None) -> Scores:
    """Corpus BLEU and chrF of detokenized hypotheses against references, line by line."""
    if len(hypotheses) != len(references):
        raise EvalError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; the files must have one line per sentence"
        )
    if not references:
        raise EvalError("no sentences to score; give a non-empty test set")
    bleu = sacrebleu.metrics.BLEU(tokenize=bleu_tokenizer(tgt_lang, tokenize))
    chrf = sacrebleu.metrics.CHRF()
    refs = [list(references)]
    b = bleu.corpus_score(list(hypotheses), refs)
    c = chrf.corpus_score(list(hypotheses), refs)
    return Scores(
        round(b.score, 2), round(c.score, 2), str(bleu.get_signature()), str(chrf.get_signature()), len(references)
    )
