"""bench.wmt_scale's corpus: a synthetic English-German corpus shaped like WMT 2014, written as the hub's ``wmt/wmt14``.

Log-normal sentence lengths (mean about 25 words, a tail past 100, clipped at 250), targets about 1.1x the
source, words drawn from a Zipf law over made-up words; parquet files under ``de-en/`` and a README that
declares the ``de-en`` config, so ``datasets.load_dataset(folder, "de-en")`` reads it offline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HELD_OUT = {"validation": 3_000, "test": 3_000}
SHARD_PAIRS = 500_000  # pairs per parquet file, about the hub's file size
CHUNK_PAIRS = 100_000  # pairs generated at once (one parquet row group)
VOCAB_WORDS = 300_000  # word types per language
ZIPF_S, ZIPF_Q = 1.1, 2.7  # Zipf-Mandelbrot: p(rank r) ~ 1 / (r + q)^s
MEAN_WORDS, LENGTH_SIGMA, MAX_WORDS = 25.0, 0.6, 250
TARGET_RATIO, RATIO_SIGMA = 1.1, 0.15
SYLLABLES = {  # onsets, nuclei, codas; words are 1-6 syllables, frequent words shorter
    "en": (
        [
            "",
            "b",
            "c",
            "d",
            "f",
            "g",
            "h",
            "l",
            "m",
            "n",
            "p",
            "r",
            "s",
            "t",
            "w",
            "th",
            "sh",
            "st",
            "tr",
            "br",
            "pl",
            "gr",
        ],
        ["a", "e", "i", "o", "u", "ea", "oo", "ou", "ai", "y"],
        ["", "", "", "n", "r", "s", "t", "d", "l", "ng", "st", "ck", "nd", "m"],
    ),
    "de": (
        [
            "",
            "b",
            "d",
            "f",
            "g",
            "h",
            "k",
            "l",
            "m",
            "n",
            "p",
            "r",
            "s",
            "t",
            "w",
            "z",
            "sch",
            "st",
            "sp",
            "pf",
            "kr",
            "gr",
            "br",
        ],
        ["a", "e", "i", "o", "u", "ei", "au", "ie", "eu", "ä", "ö", "ü"],
        ["", "", "n", "r", "s", "t", "ch", "ng", "nd", "rt", "tz", "ck", "ß", "st", "m"],
    ),
}
SYLLABLES_PER_DECADE = 0.17  # a word of rank r has 1 + Poisson(0.17 log10(r + 1) + extra) syllables
EXTRA_SYLLABLES = {"en": 0.0, "de": 0.25}  # German words run longer


# ---- the synthetic corpus ------------------------------------------------------------------------------


def _join(pieces: pa.Array, lengths: np.ndarray, sep: str) -> pa.Array:
    """Consecutive runs of ``pieces`` (``lengths[i]`` of them for the i-th string) joined by ``sep``."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), pieces), sep)


def make_vocabulary(lang: str, rng: np.random.Generator) -> pa.Array:
    """``VOCAB_WORDS`` made-up words by frequency rank, then the same words capitalised (rank + VOCAB_WORDS)."""
    onsets, nuclei, codas = SYLLABLES[lang]
    syllables = pa.array([o + n + c for o in onsets for n in nuclei for c in codas])
    ranks = np.arange(VOCAB_WORDS)
    count = 1 + rng.poisson(EXTRA_SYLLABLES[lang] + SYLLABLES_PER_DECADE * np.log10(ranks + 1))
    count = np.minimum(count, 6)
    words = _join(syllables.take(pa.array(rng.integers(len(syllables), size=int(count.sum())))), count, "")
    return pa.concat_arrays([words, pc.utf8_capitalize(words)])


def zipf_cdf() -> np.ndarray:
    """Cumulative Zipf-Mandelbrot probabilities of the ranks 0..VOCAB_WORDS-1."""
    weights = 1.0 / (np.arange(VOCAB_WORDS) + ZIPF_Q) ** ZIPF_S
    return np.cumsum(weights / weights.sum())


def sentence_lengths(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Source lengths in words (log-normal, mean ``MEAN_WORDS``) and target lengths (~``TARGET_RATIO`` x source)."""
    mu = np.log(MEAN_WORDS) - LENGTH_SIGMA**2 / 2
    src = np.clip(np.rint(rng.lognormal(mu, LENGTH_SIGMA, n)), 1, MAX_WORDS).astype(np.int64)
    tgt = np.clip(np.rint(src * TARGET_RATIO * rng.lognormal(0.0, RATIO_SIGMA, n)), 1, MAX_WORDS).astype(np.int64)
    return src, tgt


def _starts(lengths: np.ndarray) -> np.ndarray:
    return np.cumsum(lengths) - lengths


def _sentences(vocab: pa.Array, ranks: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Strings of the word ranks, ``lengths`` words each: first word capitalised, a full stop at the end."""
    ranks = ranks.copy()
    ranks[_starts(lengths)] += VOCAB_WORDS
    return pc.binary_join_element_wise(_join(vocab.take(pa.array(ranks)), lengths, " "), ".", "")


def make_pairs(
    n: int, rng: np.random.Generator, vocab: dict[str, pa.Array], cdf: np.ndarray, mapping: np.ndarray
) -> pa.StructArray:
    """``n`` pairs {de, en}: the German side translates the English word by word through ``mapping``
    while both run, then goes on (or stops) with words of its own."""
    src_len, tgt_len = sentence_lengths(n, rng)
    src = np.minimum(np.searchsorted(cdf, rng.random(int(src_len.sum()))), VOCAB_WORDS - 1)
    tgt = np.minimum(np.searchsorted(cdf, rng.random(int(tgt_len.sum()))), VOCAB_WORDS - 1)
    sentence = np.repeat(np.arange(n), tgt_len)
    position = np.arange(len(tgt)) - np.repeat(_starts(tgt_len), tgt_len)
    aligned = position < src_len[sentence]
    tgt[aligned] = mapping[src[_starts(src_len)[sentence[aligned]] + position[aligned]]]
    return pa.StructArray.from_arrays(
        [_sentences(vocab["de"], tgt, tgt_len), _sentences(vocab["en"], src, src_len)], names=["de", "en"]
    )


def _files(split: str, pairs: int) -> list[tuple[str, int]]:
    """(parquet name, pairs in it) of a split, in the hub's ``split-0000i-of-0000n`` naming."""
    shards = max(1, -(-pairs // SHARD_PAIRS))
    return [
        (f"{split}-{i:05d}-of-{shards:05d}.parquet", min(SHARD_PAIRS, pairs - i * SHARD_PAIRS)) for i in range(shards)
    ]


README = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
  - split: test
    path: de-en/test-*
---
# Synthetic WMT 2014 de-en

Made by `python -m bench.wmt_scale`: {pairs} made-up training pairs in the layout of the hub's `wmt/wmt14`.
"""


def generate(folder: Path, pairs: int, seed: int) -> None:
    """Write the corpus: ``pairs`` training pairs and the held-out splits, deterministic from ``seed``."""
    rng = np.random.default_rng([seed, 0])
    vocab = {lang: make_vocabulary(lang, rng) for lang in ("de", "en")}
    keys = np.arange(VOCAB_WORDS) * rng.lognormal(0.0, 0.5, VOCAB_WORDS)  # ranks jittered: frequent stays frequent
    mapping = np.argsort(np.argsort(keys))
    cdf = zipf_cdf()
    (folder / "de-en").mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("translation", pa.struct([("de", pa.string()), ("en", pa.string())]))])
    for s, (split, total) in enumerate({"train": pairs, **HELD_OUT}.items(), 1):
        chunk = 0
        for name, size in _files(split, total):
            with pq.ParquetWriter(folder / "de-en" / name, schema) as writer:
                for start in range(0, size, CHUNK_PAIRS):
                    rows = make_pairs(
                        min(CHUNK_PAIRS, size - start), np.random.default_rng([seed, s, chunk]), vocab, cdf, mapping
                    )
                    writer.write_table(pa.Table.from_arrays([rows], schema=schema))
                    chunk += 1
    (folder / "README.md").write_text(README.replace("{pairs}", f"{pairs:,}"), encoding="utf-8")
