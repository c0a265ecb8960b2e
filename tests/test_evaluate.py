"""Scores: sacrebleu's corpus BLEU and chrF with signatures; the tokenizer follows the target language."""

import pytest
import sacrebleu

from transformer.errors import EvalError
from transformer.evaluate import bleu_tokenizer, score


def test_same_as_sacrebleu_and_signature_printed():
    hyps = ["The cat sat on the mat.", "A dog runs in a park."]
    refs = ["The cat sat on a mat.", "A dog is running in the park."]
    s = score(hyps, refs, "en")
    assert s.bleu == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert s.chrf == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert "tok:13a" in s.bleu_signature and s.sentences == 2


def test_tokenizer_follows_target_language():
    assert bleu_tokenizer("zh") == "zh"
    assert bleu_tokenizer("en") == "13a"
    assert bleu_tokenizer("zh", "char") == "char"
    assert "tok:zh" in score(["我们明天去公园。"], ["我们明天去公园。"], "zh").bleu_signature


def test_line_count_mismatch_refused():
    with pytest.raises(EvalError, match="2 hypotheses but 3 references"):
        score(["a", "b"], ["a", "b", "c"], "en")
