"""bench.padding's measurement on the shipped sample corpus: static rows only add padding, rounding to 8
leaves no more shapes than no rounding, and the coverage counts stay within the shape count."""

from __future__ import annotations

from collections import Counter

import pytest
from tiny import tiny_config

from bench.padding import PAD_MULTIPLES, encoded, measure, shapes_covering
from transformer.text.batching import EncodedCorpus


@pytest.fixture(scope="module")
def sample_ids(tmp_path_factory: pytest.TempPathFactory) -> EncodedCorpus:
    folder = tmp_path_factory.mktemp("padding")
    return encoded(tiny_config(folder), folder / "cache")


def test_coverage_counts_the_most_frequent_shapes() -> None:
    counts = Counter({(8, 8): 90, (16, 16): 9, (24, 24): 1})
    assert [shapes_covering(counts, s) for s in (0.5, 0.9, 0.99, 1.0)] == [1, 1, 2, 3]


@pytest.mark.parametrize("batch_tokens", [300, 1000])
def test_static_rows_add_padding_and_coarse_rounding_merges_shapes(
    sample_ids: EncodedCorpus, batch_tokens: int
) -> None:
    rows = {m: measure(sample_ids, batch_tokens, m) for m in PAD_MULTIPLES}
    for r in rows.values():
        assert 0 <= r["padding"] <= r["static_padding"] < 1
        assert r["shapes"] >= r["shapes_99"] >= r["shapes_90"] >= 1 and r["batches"] >= r["shapes"]
    assert rows[1]["shapes"] >= rows[8]["shapes"]
