"""BLEU and chrF through sacrebleu, on detokenized text against untouched references.

Training-time validation and ``tfm eval`` both score through ``score`` so the two
numbers are the same kind of number. The BLEU tokenizer follows the target
language (``zh`` for Chinese, ``ja-mecab`` is left to the user, ``13a`` otherwise)
unless the config names one. Lowercased BLEU (sacreBLEU's ``-lc``) comes beside the cased figure,
since published Multi30k tables often report it.
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
    bleu_lc: float  # lowercased hypotheses and references, as sacreBLEU -lc
    bleu_lc_signature: str

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
    tok = bleu_tokenizer(tgt_lang, tokenize)
    bleu, bleu_lc = sacrebleu.metrics.BLEU(tokenize=tok), sacrebleu.metrics.BLEU(tokenize=tok, lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    hyps, refs = list(hypotheses), [list(references)]
    b, lc, c = bleu.corpus_score(hyps, refs), bleu_lc.corpus_score(hyps, refs), chrf.corpus_score(hyps, refs)
    return Scores(
        round(b.score, 2),
        round(c.score, 2),
        str(bleu.get_signature()),
        str(chrf.get_signature()),
        len(references),
        round(lc.score, 2),
        str(bleu_lc.get_signature()),
    )
