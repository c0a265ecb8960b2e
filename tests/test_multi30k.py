"""Multi30k: the three splits from TFM_MULTI30K, missing files downloaded, and offline a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_files import one_line_error

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.text import multi30k
from transformer.text.corpus import Corpus, load_split


def test_multi30k_splits(multi30k_train: Corpus, multi30k_val: Corpus, multi30k_cfg: DataConfig) -> None:
    test = load_split(multi30k_cfg, multi30k_cfg.test_split)
    assert (len(multi30k_train), len(multi30k_val), len(test)) == (29000, 1014, 1000)
    assert multi30k_val.src[1] == "Ein Mann schläft in einem grünen Raum auf einem Sofa."
    assert multi30k_train.name == "multi30k:train"


def test_multi30k_offline_names_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, dest: Path) -> None:
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(multi30k, "_download", offline)
    monkeypatch.setenv("TFM_MULTI30K", str(tmp_path / "m30k"))
    (tmp_path / "m30k").mkdir()
    with pytest.raises(DataError) as e:
        load_split(DataConfig(format="multi30k"), "train")
    message = one_line_error(e)
    assert "train.de.gz" in message and "train.en.gz" in message and str(tmp_path / "m30k") in message
    assert "TFM_MULTI30K" in message and "github.com/multi30k/dataset" in message


def test_multi30k_downloads_missing_files(tmp_path: Path, multi30k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multi30k, "MULTI30K_URL", multi30k_dir.as_uri())  # the real downloader, via file://
    monkeypatch.delenv("TFM_MULTI30K")
    c = load_split(DataConfig(format="multi30k", path=str(tmp_path)), "val")
    assert len(c) == 1014 and sorted(p.name for p in tmp_path.iterdir()) == ["val.de.gz", "val.en.gz"]


def test_a_folder_that_does_not_exist_is_named_and_never_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFM_MULTI30K", str(tmp_path / "x" / "nowhere" / "m30k"))
    with pytest.raises(DataError, match=r"Multi30k folder .*nowhere/m30k \(TFM_MULTI30K\) does not exist"):
        load_split(DataConfig(format="multi30k"), "train")
    assert list(tmp_path.iterdir()) == []
