"""Scores: sacrebleu's corpus BLEU and chrF with signatures; the tokenizer follows the target language."""

from pathlib import Path

import pytest
import sacrebleu
from corpus_files import tatoeba_config

from transformer.errors import EvalError
from transformer.scoring import bleu_tokenizer, score


def test_same_as_sacrebleu_and_signature_printed():
    hyps = ["The cat sat on the mat.", "A dog runs in a park."]
    refs = ["The cat sat on a mat.", "A dog is running in the park."]
    s = score(hyps, refs, "en")
    assert s.bleu == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert s.chrf == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert "tok:13a" in s.bleu_signature and s.sentences == 2


def test_lowercased_bleu_is_sacrebleus_lc():
    hyps = ["The Cat sat on the mat.", "a dog runs in a park."]
    refs = ["the cat sat on a mat.", "A dog is running in the Park."]
    s = score(hyps, refs, "en")
    assert s.bleu_lc == round(sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score, 2) > s.bleu
    assert "case:lc" in s.bleu_lc_signature and "case:mixed" in s.bleu_signature


def test_line_count_mismatch_refused():
    with pytest.raises(EvalError, match="2 hypotheses but 3 references"):
        score(["a", "b"], ["a", "b", "c"], "en")


def test_bleu_tokenizer_follows_the_target_language() -> None:
    assert [bleu_tokenizer(lang) for lang in ("zh", "cmn", "zh-TW", "en", "de")] == ["zh", "zh", "zh", "13a", "13a"]
    assert bleu_tokenizer("zh", "char") == "char"
    hyp, ref = ["我们明天去公园玩。"], ["我们明天去公园。"]
    zh = score(hyp, ref, "zh")
    assert "tok:zh" in zh.bleu_signature and "nc:6" in zh.chrf_signature
    assert 0 < zh.bleu < 100 and zh.chrf > 0
    assert score(hyp, ref, "en").bleu == 0.0  # 13a sees one unspaced "word": no credit at all
    assert "tok:13a" in score(["We go."], ["We go."], "en").bleu_signature


def test_tatoeba_configs_score_by_their_target_language(tatoeba: Path) -> None:
    for direction, tok in (("en-zh", "zh"), ("zh-en", "13a")):
        cfg = tatoeba_config(direction, tatoeba)
        assert bleu_tokenizer(cfg.data.tgt_lang, cfg.decode.bleu_tokenize) == tok
