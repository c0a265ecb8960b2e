"""Local corpus files: text pairs, TSV and JSONL (gzipped or not) load, and each bad file gives a
one-line DataError naming the file (and line)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from corpus_files import PAIRS, as_pairs, one_line_error, text_dir, write_lines

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.text.corpus import load_split


@pytest.mark.parametrize("ext", ["", ".gz"])
def test_text_pairs_load(tmp_path: Path, ext: str) -> None:
    c = load_split(DataConfig(format="text", path=str(text_dir(tmp_path, ext=ext))), "train")
    assert as_pairs(c) == PAIRS and c.name == "text:train" and c.dropped_empty == 0 and len(c) == 3


def test_tsv_columns_and_header(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.tsv", [f"{de}\t{en}" for de, en in PAIRS])
    assert as_pairs(load_split(DataConfig(format="tsv", path=str(tmp_path)), "train")) == PAIRS
    write_lines(tmp_path / "data.tsv", ["EN\tDE", *(f"{en}\t{de}" for de, en in PAIRS)])
    assert as_pairs(load_split(DataConfig(format="tsv", path=str(tmp_path / "data.tsv")), "train")) == PAIRS


def test_tsv_columns_give_both_directions_from_one_file(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_text("Hi.\t你好。\nRun!\t跑！\n", encoding="utf-8")
    en_zh = DataConfig(format="tsv", path=str(tmp_path), tsv_columns=["en", "zh"], src_lang="en", tgt_lang="zh")
    zh_en = DataConfig(format="tsv", path=str(tmp_path), tsv_columns=["en", "zh"], src_lang="zh", tgt_lang="en")
    a, b = load_split(en_zh, "train"), load_split(zh_en, "train")
    assert (list(a.src), list(a.tgt)) == (["Hi.", "Run!"], ["你好。", "跑！"])
    assert (list(b.src), list(b.tgt)) == (["你好。", "跑！"], ["Hi.", "Run!"])
    assert a.fingerprint != b.fingerprint  # cached token ids of one direction never serve the other


def test_jsonl_plain_and_nested(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.jsonl", [json.dumps({"de": de, "en": en}) for de, en in PAIRS])
    assert as_pairs(load_split(DataConfig(format="jsonl", path=str(tmp_path)), "train")) == PAIRS
    nested = write_lines(
        tmp_path / "n.jsonl.gz", [json.dumps({"translation": {"de": de, "en": en}}) for de, en in PAIRS]
    )
    cfg = DataConfig(format="jsonl", path=str(nested), hf_field="translation")
    assert as_pairs(load_split(cfg, "train")) == PAIRS


def test_bom_crlf_and_lowercase(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_bytes("\ufeffEin Haus\r\nZWEI\r\n".encode())
    (tmp_path / "train.en").write_bytes(b"A House\r\nTWO\r\n")
    cfg = DataConfig(format="text", path=str(tmp_path))
    assert as_pairs(load_split(cfg, "train")) == [("Ein Haus", "A House"), ("ZWEI", "TWO")]
    assert as_pairs(load_split(replace(cfg, lowercase=True), "train")) == [("ein haus", "a house"), ("zwei", "two")]


def test_missing_files_named(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.de", ["a"])
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="text", path=str(tmp_path)), "train")
    assert "train.en" in one_line_error(e) and "train.de" not in str(e.value)


def test_different_line_counts_name_both_files(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.de", ["a", "b", "c"])
    write_lines(tmp_path / "train.en.gz", ["a", "b"])
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="text", path=str(tmp_path)), "train")
    message = one_line_error(e)
    assert "train.de has 3 lines" in message and "train.en.gz has 2" in message


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_bytes(b"eins\nzwei\ndr\xffei\n")
    write_lines(tmp_path / "train.en", ["one", "two", "three"])
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="text", path=str(tmp_path)), "train")
    assert f"{tmp_path / 'train.de'}:3" in one_line_error(e) and "UTF-8" in str(e.value)


def test_truncated_gzip(tmp_path: Path) -> None:
    text_dir(tmp_path, ext=".gz")
    path = tmp_path / "train.de.gz"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="text", path=str(tmp_path)), "train")
    assert "train.de.gz" in one_line_error(e)


@pytest.mark.parametrize(
    ("name", "lines", "fmt", "expect"),
    [
        ("train.tsv", ["a\tb", "only one column"], "tsv", "train.tsv:2"),
        ("train.jsonl", ['{"de": "a", "en": "b"}', "{not json"], "jsonl", "train.jsonl:2"),
        ("train.jsonl", ['{"de": "a", "fr": "b"}'], "jsonl", "train.jsonl:1"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path: Path, name: str, lines: list[str], fmt: str, expect: str) -> None:
    write_lines(tmp_path / name, lines)
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format=fmt, path=str(tmp_path)), "train")
    assert expect in one_line_error(e)


def test_single_file_has_only_a_train_split(tmp_path: Path) -> None:
    single = write_lines(tmp_path / "all.tsv", ["a\tb", "c\td", "e\tf"])
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="tsv", path=str(single)), "val")
    assert "holdout" in one_line_error(e)
