"""Corpora: every format loads, Multi30k offline, holdout splits, and each bad input gives a one-line DataError."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from transformer import corpus as corpus_mod
from transformer.config import DataConfig
from transformer.corpus import ArrowColumn, Corpus, load_split
from transformer.errors import DataError

PAIRS = [("Ein Mann fährt Fahrrad.", "A man rides a bike."), ("Der Hund läuft.", "The dog runs."), ("Grün.", "Green.")]


def write_lines(path: Path, lines: list[str]) -> Path:
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def text_dir(tmp_path: Path, pairs: list[tuple[str, str]] = PAIRS, split: str = "train", ext: str = "") -> Path:
    write_lines(tmp_path / f"{split}.de{ext}", [p[0] for p in pairs])
    write_lines(tmp_path / f"{split}.en{ext}", [p[1] for p in pairs])
    return tmp_path


def as_pairs(c: Corpus) -> list[tuple[str, str]]:
    return list(zip(c.src, c.tgt))


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ---- formats -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["", ".gz"])
def test_text_pairs_load(tmp_path: Path, ext: str) -> None:
    c = load_split(DataConfig(format="text", path=str(text_dir(tmp_path, ext=ext))), "train")
    assert as_pairs(c) == PAIRS and c.name == "text:train" and c.dropped_empty == 0 and len(c) == 3


def test_sample_corpus_ships_with_the_project(sample_cfg: DataConfig) -> None:
    train, valid = load_split(sample_cfg, "train"), load_split(sample_cfg, sample_cfg.valid_split)
    assert 400 <= len(train) <= 600 and 50 <= len(valid) <= 100
    assert ("Ein Mann fährt Fahrrad.", "A man rides a bike.") in as_pairs(train)
    assert not set(valid.src) & set(train.src)


def test_multi30k_splits(multi30k_train: Corpus, multi30k_val: Corpus, multi30k_cfg: DataConfig) -> None:
    test = load_split(multi30k_cfg, multi30k_cfg.test_split)
    assert (len(multi30k_train), len(multi30k_val), len(test)) == (29000, 1014, 1000)
    assert multi30k_val.src[1] == "Ein Mann schläft in einem grünen Raum auf einem Sofa."
    assert multi30k_train.name == "multi30k:train"


def test_tsv_columns_and_header(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.tsv", [f"{de}\t{en}" for de, en in PAIRS])
    assert as_pairs(load_split(DataConfig(format="tsv", path=str(tmp_path)), "train")) == PAIRS
    write_lines(tmp_path / "data.tsv", ["EN\tDE", *(f"{en}\t{de}" for de, en in PAIRS)])
    assert as_pairs(load_split(DataConfig(format="tsv", path=str(tmp_path / "data.tsv")), "train")) == PAIRS


def test_jsonl_plain_and_nested(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.jsonl", [json.dumps({"de": de, "en": en}) for de, en in PAIRS])
    assert as_pairs(load_split(DataConfig(format="jsonl", path=str(tmp_path)), "train")) == PAIRS
    nested = write_lines(tmp_path / "n.jsonl.gz", [json.dumps({"translation": {"de": de, "en": en}}) for de, en in PAIRS])
    cfg = DataConfig(format="jsonl", path=str(nested), hf_field="translation")
    assert as_pairs(load_split(cfg, "train")) == PAIRS


def test_bom_crlf_and_lowercase(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_bytes("\ufeffEin Haus\r\nZWEI\r\n".encode())
    (tmp_path / "train.en").write_bytes(b"A House\r\nTWO\r\n")
    cfg = DataConfig(format="text", path=str(tmp_path))
    assert as_pairs(load_split(cfg, "train")) == [("Ein Haus", "A House"), ("ZWEI", "TWO")]
    assert as_pairs(load_split(replace(cfg, lowercase=True), "train")) == [("ein haus", "a house"), ("zwei", "two")]


def test_tatoeba_tsv_holdout_is_seeded_and_disjoint() -> None:
    path = Path(os.environ["TFM_MULTI30K"]).parent / "tatoeba-cmn-eng" / "cmn-eng.tsv.gz"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    cfg = DataConfig(format="tsv", path=str(path), src_lang="en", tgt_lang="zh", holdout=[300, 200], split_seed=3)
    train, valid, test = (load_split(cfg, s) for s in (cfg.train_split, cfg.valid_split, cfg.test_split))
    assert (len(valid), len(test), len(train)) == (300, 200, 21116 - 500 - train.dropped_empty)
    assert not (set(as_pairs(valid)) & set(as_pairs(test))) and not (set(as_pairs(valid)) & set(as_pairs(train)))
    assert as_pairs(load_split(cfg, cfg.valid_split)) == as_pairs(valid)
    assert as_pairs(load_split(replace(cfg, split_seed=4), cfg.valid_split)) != as_pairs(valid)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in valid.tgt[0]) and valid.name == "tsv:val"


# ---- Multi30k download ----------------------------------------------------------------------------


def test_multi30k_offline_names_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, dest: Path) -> None:
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(corpus_mod, "_download", offline)
    monkeypatch.setenv("TFM_MULTI30K", str(tmp_path / "m30k"))
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="multi30k"), "train")
    message = one_line_error(e)
    assert "train.de.gz" in message and "train.en.gz" in message and str(tmp_path / "m30k") in message
    assert "TFM_MULTI30K" in message and "github.com/multi30k/dataset" in message


def test_multi30k_downloads_missing_files(tmp_path: Path, multi30k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus_mod, "MULTI30K_URL", multi30k_dir.as_uri())  # the real downloader, via file://
    monkeypatch.delenv("TFM_MULTI30K")
    c = load_split(DataConfig(format="multi30k", path=str(tmp_path)), "val")
    assert len(c) == 1014 and sorted(p.name for p in tmp_path.iterdir()) == ["val.de.gz", "val.en.gz"]


# ---- Hugging Face datasets ------------------------------------------------------------------------


@pytest.fixture
def hf_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``datasets`` offline, with its cache in tmp_path."""
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    datasets.disable_progress_bars()
    return tmp_path


def test_hf_load_dataset_on_local_parquet_columns(hf_offline: Path) -> None:
    from datasets import Dataset

    folder = hf_offline / "pq"
    rows = {"de": [p[0] for p in PAIRS] + ["  "], "en": [p[1] for p in PAIRS] + ["x"]}
    Dataset.from_dict(rows).to_parquet(str(folder / "train.parquet"))
    Dataset.from_dict({"de": ["Ja."], "en": ["Yes."]}).to_parquet(str(folder / "validation.parquet"))
    cfg = DataConfig(format="hf", path=str(folder), valid_split="validation")
    train = load_split(cfg, "train")
    assert as_pairs(train) == PAIRS and train.dropped_empty == 1 and isinstance(train.src, ArrowColumn)
    assert as_pairs(load_split(cfg, "validation")) == [("Ja.", "Yes.")]
    with pytest.raises(DataError) as e:
        load_split(cfg, "val")
    assert "val" in one_line_error(e) and "split" in str(e.value)


def test_hf_load_from_disk_translation_field(hf_offline: Path) -> None:
    from datasets import Dataset, DatasetDict

    rows = [{"de": de, "en": en} for de, en in PAIRS]
    DatasetDict({"train": Dataset.from_dict({"translation": rows})}).save_to_disk(str(hf_offline / "saved"))
    cfg = DataConfig(format="hf", path=str(hf_offline / "saved"), lowercase=True)
    assert as_pairs(load_split(cfg, "train")) == [(de.lower(), en.lower()) for de, en in PAIRS]
    with pytest.raises(DataError) as e:
        load_split(replace(cfg, src_lang="fr"), "train")
    assert "hf_field" in one_line_error(e)
    with pytest.raises(DataError) as e:
        load_split(cfg, "test")
    assert "no split 'test'" in one_line_error(e)


def test_hf_unknown_dataset_offline(hf_offline: Path) -> None:
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="hf", path="no-such-user/no-such-dataset"), "train")
    assert "no-such-user/no-such-dataset" in one_line_error(e)


# ---- large corpora go through Arrow ----------------------------------------------------------------


def test_large_text_corpus_is_memory_mapped_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus_mod, "ARROW_ABOVE_BYTES", 0)
    folder = text_dir(tmp_path, PAIRS + [("", "empty")] + PAIRS, ext=".gz")
    cfg = DataConfig(format="text", path=str(folder))
    c = load_split(cfg, "train")
    assert isinstance(c.src, ArrowColumn) and as_pairs(c) == PAIRS + PAIRS and c.dropped_empty == 1
    assert c.src[-1] == PAIRS[-1][0] and c.tgt[1:5:2] == [PAIRS[1][1], PAIRS[0][1]] and list(c.src) == c.src[:]
    cached = sorted((tmp_path / "cache" / "tfm-corpora").iterdir())
    assert [p.suffix for p in cached] == [".arrow", ".json"]
    again = load_split(cfg, "train")
    assert as_pairs(again) == as_pairs(c) and again.fingerprint == c.fingerprint
    held = load_split(replace(cfg, holdout=[1, 1]), "val")
    assert isinstance(held.src, ArrowColumn) and len(held) == 1


def test_arrow_conversion_error_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus_mod, "ARROW_ABOVE_BYTES", 0)
    write_lines(tmp_path / "train.de", ["a", "b", "c"])
    write_lines(tmp_path / "train.en", ["a", "b"])
    with pytest.raises(DataError):
        load_split(DataConfig(format="text", path=str(tmp_path)), "train")
    assert list((tmp_path / "cache" / "tfm-corpora").iterdir()) == []


# ---- bad input ----------------------------------------------------------------------------------


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


def test_empty_and_blank_pairs_dropped_and_counted(tmp_path: Path) -> None:
    pairs = [("a", "A"), ("", "B"), ("  \t", "C"), ("d", " "), ("e", "E")]
    c = load_split(DataConfig(format="text", path=str(text_dir(tmp_path, pairs))), "train")
    assert as_pairs(c) == [("a", "A"), ("e", "E")] and c.dropped_empty == 3


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


def test_unknown_splits(tmp_path: Path) -> None:
    single = write_lines(tmp_path / "all.tsv", ["a\tb", "c\td", "e\tf"])
    cfg = DataConfig(format="tsv", path=str(single))
    with pytest.raises(DataError) as e:
        load_split(cfg, "val")
    assert "holdout" in one_line_error(e)
    with pytest.raises(DataError) as e:
        load_split(replace(cfg, holdout=[1, 1]), "dev")
    assert "dev" in one_line_error(e)
    with pytest.raises(DataError) as e:
        load_split(replace(cfg, holdout=[2, 1]), "train")
    assert "holdout" in one_line_error(e)


def test_arrow_column_sequence() -> None:
    import numpy as np
    import pyarrow as pa

    col = ArrowColumn(pa.chunked_array([["A", "B"], ["C", None, "E"]]), lowercase=True)
    assert len(col) == 5 and col[2] == "c" and col[3] == "" and col[-1] == "e" and list(col) == ["a", "b", "c", "", "e"]
    sub = col.subset(np.array([4, 0, 2]))
    assert sub[:] == ["e", "a", "c"] and sub[::-1] == ["c", "a", "e"] and sub.subset(np.array([1]))[0] == "a"
    with pytest.raises(IndexError):
        col[5]
