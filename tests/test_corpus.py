"""Corpus: the shipped sample loads, empty pairs are dropped and counted, data.holdout cuts a
seeded split shared by both directions, and ArrowColumn reads like a list of strings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from corpus_files import as_pairs, has_cjk, one_line_error, tatoeba_config, text_dir, write_lines

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.text.corpus import ArrowColumn, load_split


def test_sample_corpus_ships_with_the_project(sample_cfg: DataConfig) -> None:
    train, valid = load_split(sample_cfg, "train"), load_split(sample_cfg, sample_cfg.valid_split)
    assert 400 <= len(train) <= 600 and 50 <= len(valid) <= 100
    assert ("Ein Mann fährt Fahrrad.", "A man rides a bike.") in as_pairs(train)
    assert not set(valid.src) & set(train.src)


def test_empty_and_blank_pairs_dropped_and_counted(tmp_path: Path) -> None:
    pairs = [("a", "A"), ("", "B"), ("  \t", "C"), ("d", " "), ("e", "E")]
    c = load_split(DataConfig(format="text", path=str(text_dir(tmp_path, pairs))), "train")
    assert as_pairs(c) == [("a", "A"), ("e", "E")] and c.dropped_empty == 3


def test_tatoeba_tsv_holdout_is_seeded_and_disjoint(tatoeba: Path) -> None:
    cfg = DataConfig(format="tsv", path=str(tatoeba), src_lang="en", tgt_lang="zh", holdout=[300, 200], split_seed=3)
    train, valid, test = (load_split(cfg, s) for s in (cfg.train_split, cfg.valid_split, cfg.test_split))
    assert (len(valid), len(test), len(train)) == (300, 200, 21116 - 500 - train.dropped_empty)
    assert not (set(as_pairs(valid)) & set(as_pairs(test))) and not (set(as_pairs(valid)) & set(as_pairs(train)))
    assert as_pairs(load_split(cfg, cfg.valid_split)) == as_pairs(valid)
    assert as_pairs(load_split(replace(cfg, split_seed=4), cfg.valid_split)) != as_pairs(valid)
    assert has_cjk(valid.tgt[0]) and valid.name == "tsv:val"


def test_seeded_split_is_reproducible_and_both_directions_share_it(tatoeba: Path) -> None:
    en_zh, zh_en = tatoeba_config("en-zh", tatoeba).data, tatoeba_config("zh-en", tatoeba).data
    splits = ("train", "valid", "test")
    a = {s: load_split(en_zh, s) for s in splits}
    b = {s: load_split(zh_en, s) for s in splits}
    assert [len(a[s]) for s in splits] == [19_116, 1_000, 1_000]
    for s in splits:
        assert list(a[s].src) == list(b[s].tgt) and list(a[s].tgt) == list(b[s].src)
        assert a[s].split_record == b[s].split_record == a["train"].split_record
    again = load_split(en_zh, "test")
    assert list(again.src) == list(a["test"].src) and again.split_record == a["test"].split_record
    assert has_cjk(a["test"].tgt[0]) and not has_cjk(a["test"].src[0])
    record = a["train"].split_record
    assert record["pairs"] == 21_116 and record["split_seed"] == 1
    assert record["sizes"] == {"train": 19_116, "valid": 1_000, "test": 1_000}
    other = load_split(tatoeba_config("en-zh", tatoeba, "data.split_seed=2").data, "test").split_record
    assert other["rows_sha256"]["test"] != record["rows_sha256"]["test"]


def test_holdout_refuses_unknown_splits_and_sizes_that_leave_no_training_pairs(tmp_path: Path) -> None:
    cfg = DataConfig(format="tsv", path=str(write_lines(tmp_path / "all.tsv", ["a\tb", "c\td", "e\tf"])))
    with pytest.raises(DataError) as e:
        load_split(replace(cfg, holdout=[1, 1]), "dev")
    assert "dev" in one_line_error(e)
    with pytest.raises(DataError) as e:
        load_split(replace(cfg, holdout=[2, 1]), "train")
    assert "holdout" in one_line_error(e)


def test_unknown_format_lists_the_known_ones() -> None:
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="csv"), "train")
    assert "multi30k, text, tsv, jsonl, hf" in one_line_error(e)


def test_arrow_column_sequence() -> None:
    col = ArrowColumn(pa.chunked_array([["A", "B"], ["C", None, "E"]]), lowercase=True)
    assert len(col) == 5 and col[2] == "c" and col[3] == "" and col[-1] == "e" and list(col) == ["a", "b", "c", "", "e"]
    sub = col.subset(np.array([4, 0, 2]))
    assert sub[:] == ["e", "a", "c"] and sub[::-1] == ["c", "a", "e"] and sub.subset(np.array([1]))[0] == "a"
    with pytest.raises(IndexError):
        col[5]
