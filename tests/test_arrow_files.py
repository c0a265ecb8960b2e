"""Arrow files: a large local corpus is converted once into a cached, memory-mapped file, and a
conversion that fails leaves nothing in the cache."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from corpus_files import PAIRS, as_pairs, text_dir, write_lines

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.text import corpus
from transformer.text.arrow_files import open_arrow, write_arrow
from transformer.text.corpus import ArrowColumn, load_split


@pytest.fixture
def arrow_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every local corpus goes through Arrow, cached in tmp_path/cache."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "ARROW_ABOVE_BYTES", 0)
    return tmp_path / "cache" / "tfm-corpora"


def test_write_and_memory_map_round_trip(tmp_path: Path) -> None:
    schema = pa.schema([("x", pa.int64())])
    batches = [pa.record_batch([pa.array([1, 2])], schema=schema), pa.record_batch([pa.array([3])], schema=schema)]
    write_arrow(tmp_path / "t.arrow", schema, batches)
    assert open_arrow(tmp_path / "t.arrow")["x"].to_pylist() == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["t.arrow"]


def test_large_text_corpus_is_memory_mapped_arrow(tmp_path: Path, arrow_cache: Path) -> None:
    folder = text_dir(tmp_path, PAIRS + [("", "empty")] + PAIRS, ext=".gz")
    cfg = DataConfig(format="text", path=str(folder))
    c = load_split(cfg, "train")
    assert isinstance(c.src, ArrowColumn) and as_pairs(c) == PAIRS + PAIRS and c.dropped_empty == 1
    assert c.src[-1] == PAIRS[-1][0] and c.tgt[1:5:2] == [PAIRS[1][1], PAIRS[0][1]] and list(c.src) == c.src[:]
    assert [p.suffix for p in sorted(arrow_cache.iterdir())] == [".arrow", ".json"]
    again = load_split(cfg, "train")
    assert as_pairs(again) == as_pairs(c) and again.fingerprint == c.fingerprint
    held = load_split(replace(cfg, holdout=[1, 1]), "val")
    assert isinstance(held.src, ArrowColumn) and len(held) == 1


def test_arrow_conversion_error_leaves_nothing(tmp_path: Path, arrow_cache: Path) -> None:
    write_lines(tmp_path / "train.de", ["a", "b", "c"])
    write_lines(tmp_path / "train.en", ["a", "b"])
    with pytest.raises(DataError):
        load_split(DataConfig(format="text", path=str(tmp_path)), "train")
    assert list(arrow_cache.iterdir()) == []
