"""bench.synthetic_wmt, the corpus of bench.wmt_scale: WMT-like lengths, deterministic from its seed, and loadable
offline as the hub's wmt/wmt14."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq

from bench.synthetic_wmt import HELD_OUT, generate, sentence_lengths


def test_lengths_have_a_mean_near_25_words_and_a_long_tail() -> None:
    src, tgt = sentence_lengths(200_000, np.random.default_rng(0))
    assert 24 < src.mean() < 26
    assert 0.001 < (src > 100).mean() < 0.01
    assert src.min() >= 1 and src.max() <= 250
    assert 1.05 < tgt.sum() / src.sum() < 1.15
    assert np.corrcoef(src, tgt)[0, 1] > 0.9


def test_the_same_seed_writes_the_same_corpus(tmp_path: Path) -> None:
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate(tmp_path / name, 40, seed)
    table = {name: pq.read_table(tmp_path / name / "de-en" / "train-00000-of-00001.parquet") for name in "abc"}
    assert table["a"].equals(table["b"])
    assert not table["a"].equals(table["c"])


def test_it_loads_as_wmt14_de_en(tmp_path: Path) -> None:
    generate(tmp_path / "wmt14", 40, seed=1)
    splits = {
        s: datasets.load_dataset(str(tmp_path / "wmt14"), "de-en", split=s, cache_dir=str(tmp_path / "cache"))
        for s in ("train", *HELD_OUT)
    }
    assert {s: len(d) for s, d in splits.items()} == {"train": 40, **HELD_OUT}
    pair = splits["train"][0]["translation"]
    assert set(pair) == {"de", "en"}
    assert all(text[0].isupper() and text.endswith(".") for text in pair.values())
