"""Several directions in one model: each read with its own languages, drawn in proportion or temperature-sampled,
and what an epoch drew counted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.text.corpus import load_split
from transformer.text.directions import counts, direction_data, drawn


def test_proportional_draws_every_pair_once():
    directions = np.repeat([0, 1], [90, 10])
    assert drawn(directions, 1.0, seed=1, epoch=0) is None
    assert counts(directions, None, ["de-en", "fr-en"]) == {"de-en": 90, "fr-en": 10}


def test_a_temperature_above_one_draws_the_small_direction_more_and_keeps_the_epoch_s_size():
    directions = np.repeat([0, 1], [900, 100])
    pairs = drawn(directions, 5.0, seed=1, epoch=0)
    got = counts(directions, pairs, ["big", "small"])
    weights = np.array([900, 100]) ** (1 / 5)
    want = np.floor(weights / weights.sum() * 1000).astype(int).tolist()
    assert [got["big"], got["small"]] == want and got["small"] > 100
    assert np.isin(pairs[directions[pairs] == 1], np.flatnonzero(directions == 1)).all()
    # the small direction's pairs all come at least once; the big one's are a subset drawn without replacement
    small = pairs[directions[pairs] == 1]
    assert set(small.tolist()) == set(range(900, 1000))
    big = pairs[directions[pairs] == 0]
    assert len(set(big.tolist())) == len(big)


def test_the_same_seed_and_epoch_draw_the_same_and_another_epoch_draws_anew():
    directions = np.repeat([0, 1, 2], [500, 50, 5])
    first = drawn(directions, 3.0, seed=7, epoch=2)
    assert np.array_equal(first, drawn(directions, 3.0, seed=7, epoch=2))
    assert not np.array_equal(first, drawn(directions, 3.0, seed=7, epoch=3))


def test_each_direction_is_read_with_its_languages_and_a_text_folder_of_its_pair(tmp_path: Path):
    cfg = DataConfig(format="text", path=str(tmp_path), directions=["de-en", "fr-en"])
    (tmp_path / "fr-en").mkdir()
    de, fr = direction_data(cfg, "de", "en"), direction_data(cfg, "fr", "en")
    assert (de.src_lang, de.tgt_lang, de.path, de.directions) == ("de", "en", str(tmp_path), None)
    assert (fr.src_lang, fr.path) == ("fr", str(tmp_path / "fr-en"))
    multi30k = direction_data(DataConfig(directions=["cs-en"]), "cs", "en")
    assert (multi30k.src_lang, multi30k.path) == ("cs", "data/multi30k")


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_one_direction_is_never_resampled(temperature):
    assert drawn(np.zeros(10, dtype=np.int64), temperature, seed=1, epoch=0) is None


def test_a_tsv_with_a_column_per_language_and_jsonl_with_a_key_per_language_serve_every_direction(tmp_path: Path):
    rows = [("Ein Hund.", "A dog.", "Un chien."), ("Zwei Katzen.", "Two cats.", "Deux chats.")]
    (tmp_path / "train.tsv").write_text("de\ten\tfr\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    lines = [json.dumps({"de": de, "en": en, "fr": fr}) for de, en, fr in rows]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for fmt in ("tsv", "jsonl"):
        cfg = DataConfig(format=fmt, path=str(tmp_path), directions=["de-en", "fr-en", "en-fr"])
        read = {d: load_split(direction_data(cfg, *d.split("-")), "train") for d in cfg.directions}
        assert list(read["de-en"].src) == ["Ein Hund.", "Zwei Katzen."] and list(read["de-en"].tgt) == [
            "A dog.",
            "Two cats.",
        ]
        assert list(read["fr-en"].src) == ["Un chien.", "Deux chats."]
        assert list(read["en-fr"].tgt) == ["Un chien.", "Deux chats."]


def test_a_language_that_no_file_holds_is_one_line_naming_it(tmp_path: Path):
    (tmp_path / "train.de").write_text("Ein Hund.\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("A dog.\n", encoding="utf-8")
    cfg = DataConfig(format="text", path=str(tmp_path), directions=["de-en", "it-en"])
    with pytest.raises(DataError, match=r"missing train.it\[.gz\] in "):
        load_split(direction_data(cfg, "it", "en"), "train")
