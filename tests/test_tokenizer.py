"""Tokenizer: special tokens, exact round trip up to the stated normalisation, no lost characters, save/load."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
from corpus_files import TRADITIONAL_EMOJI, has_cjk, tatoeba_config
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.config import DataConfig, TokenizerConfig
from transformer.errors import ConfigError, DataError
from transformer.text.corpus import Corpus, load_split
from transformer.text.tokenizer import ONE_LINE, Tokenizer, train_tokenizer

MIXED = [
    "所有人，都请说 cheese 。",
    "我有3个iPhone手机，你呢？",
    "Tom 最喜欢我。",
    "我叫 Mary Smith，今年 25 岁。",
    "他是一个 DJ 。",
    "“看啊！” 她说道。",
]
FULL_WIDTH = "（你好）！？：；，。、「」『』《》“”‘’…—～％＃＠１２３ＡＢＣ"


def stated_normalisation(s: str) -> str:
    """What the docs promise decode(encode(s)) gives: NFC, whitespace runs -> one space, stripped."""
    return " ".join(unicodedata.normalize("NFC", s).split())


def test_special_tokens(multi30k_tokenizer: Tokenizer) -> None:
    t = multi30k_tokenizer
    assert (t.pad_id, t.start_id, t.end_id, t.unk_id) == (0, 1, 2, 3) == (t.PAD_ID, t.START_ID, t.END_ID, t.UNK_ID)
    assert [t.id_to_token(i) for i in range(4)] == ["<PAD>", "<START>", "<END>", "<UNK>"]
    assert t.vocab_size == TokenizerConfig().vocab_size
    ids = t.encode("Ein Hund.")
    assert t.decode([t.start_id, *ids, t.end_id, t.pad_id, t.pad_id]) == "Ein Hund."
    assert t.encode("a <END> b") != t.encode("a b") and t.end_id not in t.encode("a <END> b")
    assert t.decode(t.encode("a <END> b")) == "a <END> b"


def test_round_trip_every_multi30k_val_sentence(multi30k_tokenizer: Tokenizer, multi30k_val: Corpus) -> None:
    t = multi30k_tokenizer
    texts = [*multi30k_val.src, *multi30k_val.tgt]
    decoded = t.decode_batch(t.encode_batch(texts))
    bad = [(s, d) for s, d in zip(texts, decoded) if d != stated_normalisation(s) or d != t.normalize(s)]
    assert not bad, bad[:3]
    assert t.unk_rate(texts) < 0.001


def test_unseen_characters_become_bytes_never_unk(sample_cfg: DataConfig) -> None:
    german = load_split(sample_cfg, "train").src
    t = Tokenizer.train(german, vocab_size=600)
    s = "ok 😀 \u0007 漢字 Привет ✓ \x00"
    ids = t.encode(s)
    assert t.unk_id not in ids and t.decode(ids) == t.normalize(s) == s
    assert t.unk_rate([s]) > 0.5 and t.unk_rate(german) == 0.0


def test_chinese_decodes_without_spaces(sample_tokenizer: Tokenizer) -> None:
    for s in ["我有一只猫。", "他在公园里跑步，天气很好！", "Tom 喜欢 pizza。"]:
        assert sample_tokenizer.decode(sample_tokenizer.encode(s)) == s


def test_tatoeba_tokenizer_round_trip(tatoeba: Path) -> None:
    cfg = DataConfig(format="tsv", path=str(tatoeba), src_lang="en", tgt_lang="zh", holdout=[200, 200])
    t = train_tokenizer(TokenizerConfig(vocab_size=4000), load_split(cfg, cfg.train_split))
    valid = load_split(cfg, cfg.valid_split)
    texts = [*valid.src, *valid.tgt]
    assert t.decode_batch(t.encode_batch(texts)) == [t.normalize(s) for s in texts]
    assert t.unk_id not in {i for ids in t.encode_batch(texts) for i in ids}


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40))
def test_round_trip_any_text(sample_tokenizer: Tokenizer, s: str) -> None:
    assert sample_tokenizer.decode(sample_tokenizer.encode(s)) == sample_tokenizer.normalize(s).translate(ONE_LINE)


def test_normalisation_is_the_stated_one(sample_tokenizer: Tokenizer) -> None:
    t = sample_tokenizer
    assert t.normalize("  Ein\t Mann\u00a0 fährt\n") == "Ein Mann fährt"
    assert t.normalize("A\u0301") == "\u00c1" and t.normalize("a\u2581b") == "a b"


def test_save_load_is_atomic_and_keeps_the_fingerprint(sample_tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "run" / "tokenizer.json"
    sample_tokenizer.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]
    loaded = Tokenizer.load(path)
    assert loaded.fingerprint() == sample_tokenizer.fingerprint() and len(loaded.fingerprint()) == 64
    s = "Ein Mann fährt Fahrrad. 😀"
    assert loaded.encode(s) == sample_tokenizer.encode(s) and loaded.end_id not in loaded.encode("<END>")


def test_load_missing_or_corrupt(tmp_path: Path, sample_tokenizer: Tokenizer) -> None:
    with pytest.raises(DataError, match="not found"):
        Tokenizer.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text(sample_tokenizer.to_str()[:100])
    with pytest.raises(DataError, match="corrupt"):
        Tokenizer.load(bad)


def test_training_is_deterministic_and_sampled(sample_cfg: DataConfig) -> None:
    train = load_split(sample_cfg, "train")
    cfg = TokenizerConfig(vocab_size=700, train_sample=200)
    a, b = train_tokenizer(cfg, train), train_tokenizer(cfg, train)
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != train_tokenizer(TokenizerConfig(vocab_size=700), train).fingerprint()
    with pytest.raises(ConfigError, match="joint"):
        train_tokenizer(TokenizerConfig(joint=False), train)


@pytest.fixture(scope="module")
def chinese(tatoeba: Path) -> list[str]:
    """Every Chinese sentence of Tatoeba cmn-eng, held-out pairs included."""
    cfg = DataConfig(format="tsv", path=str(tatoeba), tsv_columns=["en", "zh"], src_lang="en", tgt_lang="zh")
    return list(load_split(cfg, "train").tgt)


@pytest.fixture(scope="module")
def tatoeba_tokenizer(tatoeba: Path) -> Tokenizer:
    """The shipped Tatoeba configs' tokenizer (8,000 joint BPE) trained on their seeded train split."""
    cfg = tatoeba_config("en-zh", tatoeba)
    return train_tokenizer(cfg.tokenizer, load_split(cfg.data, cfg.data.train_split))


def test_every_chinese_sentence_round_trips(tatoeba_tokenizer: Tokenizer, chinese: list[str]) -> None:
    """Held-out sentences too: characters never seen in training come back through byte fallback."""
    decoded = tatoeba_tokenizer.decode_batch(tatoeba_tokenizer.encode_batch(chinese))
    assert [(s, d) for s, d in zip(chinese, decoded) if s != d] == []
    assert len(chinese) == 21_116 and tatoeba_tokenizer.unk_rate(chinese) > 0


def test_round_trip_with_few_merges_spells_rare_characters_in_bytes(chinese: list[str]) -> None:
    small = Tokenizer.train(chinese, vocab_size=400)
    ids = small.encode_batch(chinese)
    assert small.unk_rate(chinese) > 0.3 and not any(small.unk_id in x for x in ids)
    assert small.decode_batch(ids) == chinese


def test_decoding_chinese_tokens_inserts_no_spaces(tatoeba_tokenizer: Tokenizer) -> None:
    """Any sequence of Chinese tokens a model may emit (bytes of rare characters included) decodes unspaced."""
    pieces = [
        i
        for i in range(tatoeba_tokenizer.vocab_size)
        if (tok := tatoeba_tokenizer.id_to_token(i)) and "▁" not in tok and has_cjk(tok) and " " not in tok
    ]
    assert len(pieces) > 1000
    rare = tatoeba_tokenizer.encode("𪚥")[1:]  # the bytes of a character outside the vocabulary, without the leading ▁
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.choice(pieces, size=12).tolist() + rare + rng.choice(pieces, size=3).tolist()
        text = tatoeba_tokenizer.decode(ids)
        assert " " not in text and "𪚥" in text


@pytest.mark.parametrize("text", MIXED)
def test_mixed_text_keeps_its_spaces(tatoeba_tokenizer: Tokenizer, text: str) -> None:
    assert tatoeba_tokenizer.decode(tatoeba_tokenizer.encode(text)) == text


def test_full_width_punctuation_survives(tatoeba_tokenizer: Tokenizer) -> None:
    """NFC, not NFKC: full-width forms are not folded to ASCII."""
    assert tatoeba_tokenizer.decode(tatoeba_tokenizer.encode(FULL_WIDTH)) == FULL_WIDTH


@pytest.mark.parametrize("text", TRADITIONAL_EMOJI)
def test_traditional_characters_and_emoji_round_trip(tatoeba_tokenizer: Tokenizer, text: str) -> None:
    ids = tatoeba_tokenizer.encode(text)
    assert tatoeba_tokenizer.unk_id not in ids and tatoeba_tokenizer.decode(ids) == text


def test_a_decoded_translation_is_one_line(sample_tokenizer: Tokenizer) -> None:
    """A model may write the byte token of a newline (or of any character that ends a line); the text it decodes to
    holds a space there, so that one output line answers one input line."""
    t = sample_tokenizer
    ends = ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
    for end in ends:
        ids = t.encode("Ein") + [t._hf.token_to_id(f"<0x{b:02X}>") for b in end.encode("utf-8")] + t.encode("Mann")
        text = t.decode(ids)
        assert text.splitlines() == [text] and text.split() == ["Ein", "Mann"], repr(end)
        assert t.decode_batch([ids]) == [text]
