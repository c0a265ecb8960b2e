"""English <-> Chinese end to end (issue 8): a language without spaces through every stage.

The corpus is Tatoeba cmn-eng (English TAB Chinese, no header) from $TFM_TATOEBA (default in
conftest.py); tests that need it skip where it is absent. Covered: ``data.tsv_columns`` gives both
directions from one file, the seeded split is reproducible, shared and written to the run
directory; the tokenizer round-trips every Chinese sentence and never puts spaces between Chinese
characters, yet keeps those of mixed text; BLEU tokenizes by target language and says so in its
signature; a tiny model overfits 32 pairs; ``tfm translate`` and ``tfm eval`` work from the shell.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny import ROOT
from transformer import checkpoint, config
from transformer.config import Config, DataConfig
from transformer.corpus import load_split
from transformer.errors import ConfigError
from transformer.evaluate import bleu_tokenizer, score
from transformer.tokenizer import Tokenizer, train_tokenizer
from transformer.train import Trainer
from transformer.translator import Translator

PARK = ("We will go to the park tomorrow.", "我们明天去公园。")
MIXED = ["所有人，都请说 cheese 。", "我有3个iPhone手机，你呢？", "Tom 最喜欢我。",
         "我叫 Mary Smith，今年 25 岁。", "他是一个 DJ 。", "“看啊！” 她说道。"]
FULL_WIDTH = "（你好）！？：；，。、「」『』《》“”‘’…—～％＃＠１２３ＡＢＣ"
TRADITIONAL_EMOJI = ["我們明天去公園。", "我们明天去公园。🌳😀", "👨‍👩‍👧 喜歡 🍜！", "𠀀𪚥𠮷"]


def _cjk(text: str) -> bool:
    return any("\u3400" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff" or ch >= "\U00020000" for ch in text)


@pytest.fixture(scope="module")
def tatoeba() -> Path:
    path = Path(os.environ["TFM_TATOEBA"]) / "cmn-eng.tsv.gz"
    if not path.is_file():
        pytest.skip(f"Tatoeba cmn-eng not found at {path}; set TFM_TATOEBA to its folder")
    return path


def shipped(direction: str, path: Path, *overrides: str) -> Config:
    """configs/tatoeba-<direction>.yaml reading the corpus at ``path``."""
    return config.load(ROOT / "configs" / f"tatoeba-{direction}.yaml", [f"data.path={path}", *overrides])


@pytest.fixture(scope="module")
def everything(tatoeba: Path) -> DataConfig:
    """The whole file as one English -> Chinese split, held-out pairs included."""
    return DataConfig(format="tsv", path=str(tatoeba), tsv_columns=["en", "zh"], src_lang="en", tgt_lang="zh")


@pytest.fixture(scope="module")
def chinese(everything: DataConfig) -> list[str]:
    """Every Chinese sentence of the corpus."""
    return list(load_split(everything, "train").tgt)


@pytest.fixture(scope="module")
def tokenizer(tatoeba: Path) -> Tokenizer:
    """The shipped configs' tokenizer (8,000 joint BPE) trained on their seeded train split."""
    cfg = shipped("en-zh", tatoeba)
    return train_tokenizer(cfg.tokenizer, load_split(cfg.data, cfg.data.train_split))


# ---- corpus: columns and the seeded split --------------------------------------------------------


@pytest.mark.parametrize("columns", [["en", "de"], ["en", "zh", "en"]])
def test_tsv_columns_are_validated(columns: list[str]) -> None:
    data = {"format": "tsv", "src_lang": "en", "tgt_lang": "zh", "tsv_columns": columns}
    with pytest.raises(ConfigError, match="data.tsv_columns"):
        config.from_dict({"data": data})


def test_split_is_written_to_the_run_directory(tatoeba: Path, tmp_path: Path) -> None:
    """One update of the shipped en->zh config (shrunk) writes split.json: the split zh->en holds out too."""
    tiny = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "tokenizer.vocab_size=400",
            "train.max_steps=1", "train.eval_sentences=2", "decode.max_len_b=2", f"run_dir={tmp_path}"]
    cfg = shipped("en-zh", tatoeba, *tiny)
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    written = json.loads((cfg.out_dir / "split.json").read_text(encoding="utf-8"))
    assert written == load_split(shipped("zh-en", tatoeba).data, "test").split_record


# ---- tokenizer -----------------------------------------------------------------------------------


def test_every_chinese_sentence_round_trips(tokenizer: Tokenizer, chinese: list[str]) -> None:
    """Held-out sentences too: characters never seen in training come back through byte fallback."""
    decoded = tokenizer.decode_batch(tokenizer.encode_batch(chinese))
    assert [(s, d) for s, d in zip(chinese, decoded) if s != d] == []
    assert len(chinese) == 21_116 and tokenizer.unk_rate(chinese) > 0


def test_round_trip_with_few_merges_spells_rare_characters_in_bytes(chinese: list[str]) -> None:
    small = Tokenizer.train(chinese, vocab_size=400)
    ids = small.encode_batch(chinese)
    assert small.unk_rate(chinese) > 0.3 and not any(small.unk_id in x for x in ids)
    assert small.decode_batch(ids) == chinese


def test_decoding_chinese_tokens_inserts_no_spaces(tokenizer: Tokenizer) -> None:
    """Any sequence of Chinese tokens a model may emit (bytes of rare characters included) decodes unspaced."""
    pieces = [i for i in range(tokenizer.vocab_size)
              if (tok := tokenizer.id_to_token(i)) and "▁" not in tok and _cjk(tok) and " " not in tok]
    assert len(pieces) > 1000
    rare = tokenizer.encode("𪚥")[1:]  # the bytes of a character outside the vocabulary, without the leading ▁
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.choice(pieces, size=12).tolist() + rare + rng.choice(pieces, size=3).tolist()
        text = tokenizer.decode(ids)
        assert " " not in text and "𪚥" in text


@pytest.mark.parametrize("text", MIXED)
def test_mixed_text_keeps_its_spaces(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_full_width_punctuation_survives(tokenizer: Tokenizer) -> None:
    """NFC, not NFKC: full-width forms are not folded to ASCII."""
    assert tokenizer.decode(tokenizer.encode(FULL_WIDTH)) == FULL_WIDTH


@pytest.mark.parametrize("text", TRADITIONAL_EMOJI)
def test_traditional_characters_and_emoji_round_trip(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert tokenizer.unk_id not in ids and tokenizer.decode(ids) == text


# ---- BLEU ----------------------------------------------------------------------------------------


def test_bleu_tokenizer_follows_the_target_language(tatoeba: Path) -> None:
    assert [bleu_tokenizer(lang) for lang in ("zh", "cmn", "zh-TW", "en", "de")] == ["zh", "zh", "zh", "13a", "13a"]
    assert bleu_tokenizer("zh", "char") == "char"
    for direction, tok in (("en-zh", "zh"), ("zh-en", "13a")):
        cfg = shipped(direction, tatoeba)
        assert bleu_tokenizer(cfg.data.tgt_lang, cfg.decode.bleu_tokenize) == tok
    hyp, ref = ["我们明天去公园玩。"], ["我们明天去公园。"]
    zh = score(hyp, ref, "zh")
    assert "tok:zh" in zh.bleu_signature and "nc:6" in zh.chrf_signature
    assert 0 < zh.bleu < 100 and zh.chrf > 0
    assert score(hyp, ref, "en").bleu == 0.0  # 13a sees one unspaced "word": no credit at all
    assert "tok:13a" in score(["We go."], ["We go."], "en").bleu_signature


# ---- a tiny model, the library and the shell -----------------------------------------------------


@pytest.fixture(scope="module")
def pairs(everything: DataConfig) -> list[tuple[str, str]]:
    """31 seeded corpus pairs of up to 12 Chinese characters, plus the README's example."""
    corpus = load_split(everything, "train")
    short = [i for i in range(len(corpus)) if len(corpus.tgt[i]) <= 12]
    rows = np.random.default_rng(0).choice(short, size=31, replace=False).tolist()
    return [(corpus.src[i], corpus.tgt[i]) for i in rows] + [PARK]


def train_tiny(folder: Path, pairs: list[tuple[str, str]], src: str, tgt: str) -> Path:
    """Overfit a 1-layer model on ``pairs`` (English first in the TSV) and return its best checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid"):
        (folder / f"{split}.tsv").write_text("".join(f"{e}\t{z}\n" for e, z in pairs), encoding="utf-8")
    steps = 80
    cfg = config.from_dict({
        "name": f"{src}-{tgt}", "run_dir": str(folder / "runs"), "device": "cpu",
        "model": {"N": 1, "d_model": 64, "d_ff": 128, "h": 2, "dropout": 0.0, "max_positions": 128},
        "data": {"format": "tsv", "path": str(folder), "tsv_columns": ["en", "zh"], "src_lang": src, "tgt_lang": tgt,
                 "valid_split": "valid", "test_split": "valid"},
        "tokenizer": {"vocab_size": 1000},
        "train": {"batch_tokens": 4000, "label_smoothing": 0.0, "peak_lr": 0.01, "warmup": 10, "max_steps": steps,
                  "eval_every": steps, "save_every": steps, "eval_sentences": len(pairs), "keep_last": 1},
        "decode": {"beam": 1},
    })
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    return cfg.out_dir / "best"


@pytest.fixture(scope="module")
def en_zh_model(tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]]) -> Path:
    return train_tiny(tmp_path_factory.mktemp("en-zh"), pairs, "en", "zh")


@pytest.fixture(scope="module")
def zh_en_model(tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]]) -> Path:
    return train_tiny(tmp_path_factory.mktemp("zh-en"), pairs, "zh", "en")


def test_tiny_en_zh_model_reproduces_32_pairs_exactly(en_zh_model: Path, pairs: list[tuple[str, str]]) -> None:
    loaded = checkpoint.load(en_zh_model)
    translator = Translator(loaded.model, loaded.tokenizer, loaded.cfg.decode, 128, torch.device("cpu"))
    out = [t.best for t in translator.translate([e for e, _ in pairs], beam=1)]
    assert [(e, z, o) for (e, z), o in zip(pairs, out) if z != o] == []


def shell(command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in bash, where ``tfm`` is this checkout's CLI (on one thread: the models are tiny)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    script = f"tfm() {{ {shlex.quote(sys.executable)} -m cli \"$@\"; }}\n{command}"
    return subprocess.run(["bash", "-c", script], input=stdin, env=env, capture_output=True,
                          encoding="utf-8", timeout=300)


def test_translate_from_the_shell_and_stdin(en_zh_model: Path, zh_en_model: Path) -> None:
    zh_en, en_zh = shlex.quote(str(zh_en_model)), shlex.quote(str(en_zh_model))
    r = shell(f'tfm translate "{PARK[1]}" --checkpoint {zh_en} --greedy')
    assert r.returncode == 0 and r.stdout == PARK[0] + "\n", r.stderr
    r = shell(f'tfm translate "{PARK[0]}" --checkpoint {en_zh} --greedy')
    assert r.returncode == 0 and r.stdout == PARK[1] + "\n", r.stderr
    lines = [PARK[1], *TRADITIONAL_EMOJI]
    r = shell(f"tfm translate --checkpoint {zh_en}", stdin="".join(f"{x}\n" for x in lines))
    out = r.stdout.split("\n")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert len(out) == len(lines) + 1 and out[0] == PARK[0] and all(out[:-1])
    r = shell(f"printf '%s\\n' {shlex.quote(PARK[0] + ' 🌳')} | tfm translate --checkpoint {en_zh}")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1 and _cjk(r.stdout), r.stderr


def test_eval_prints_the_bleu_signature_of_the_target_language(en_zh_model: Path, zh_en_model: Path) -> None:
    r = shell(f"tfm eval --checkpoint {shlex.quote(str(en_zh_model))} --beam 1")
    assert r.returncode == 0, r.stderr
    assert "BLEU = 100.00" in r.stdout and "tok:zh" in r.stdout and "chrF = 100.00" in r.stdout
    r = shell(f"tfm eval --checkpoint {shlex.quote(str(zh_en_model))} --beam 1")
    assert r.returncode == 0 and "tok:13a" in r.stdout, r.stderr
