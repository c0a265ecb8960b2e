"""Hugging Face datasets, offline: parquet folders, ``save_to_disk`` folders with a translation
field, and one-line errors for a missing split, missing columns or an unknown dataset."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from corpus_files import PAIRS, as_pairs, one_line_error

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.text.corpus import ArrowColumn, load_split


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
