"""Several directions in one model: each read with its own languages, drawn in proportion or temperature-sampled,
and what an epoch drew counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from transformer.config import DataConfig
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
