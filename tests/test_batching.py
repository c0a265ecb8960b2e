"""Encoding cache, token-sized batches (budget, padding, determinism), the one source layout
(x + <END>, right-padded) and the teacher-forcing layout."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer.text.batching import (
    Batch,
    EncodedCorpus,
    collate,
    encode_corpus,
    make_batches,
    padded_sizes,
    padding_fraction,
    sorted_batches,
    source_tensor,
    static_rows,
)
from transformer.text.corpus import Corpus, load_split
from transformer.text.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def m30k_encoded(
    multi30k_train: Corpus, multi30k_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory
) -> EncodedCorpus:
    return encode_corpus(multi30k_train, multi30k_tokenizer, 100, tmp_path_factory.mktemp("ids"))


def small_corpus(pairs: list[tuple[str, str]]) -> Corpus:
    return Corpus([p[0] for p in pairs], [p[1] for p in pairs], "small")


def test_encoding_is_cached_per_tokenizer(
    m30k_encoded: EncodedCorpus,
    multi30k_train: Corpus,
    multi30k_tokenizer: Tokenizer,
    sample_tokenizer: Tokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert len(m30k_encoded) == len(multi30k_train) and m30k_encoded.dropped_long == 0
    assert m30k_encoded.path is not None
    with monkeypatch.context() as m:
        m.setattr(Tokenizer, "encode_batch", lambda *a: pytest.fail("re-encoded despite the cache"))
        again = encode_corpus(multi30k_train, multi30k_tokenizer, 100, m30k_encoded.path.parent)
    assert again.path == m30k_encoded.path and np.array_equal(again.tgt_lengths, m30k_encoded.tgt_lengths)
    small = Corpus(multi30k_train.src[:50], multi30k_train.tgt[:50], "head", fingerprint="")
    other = encode_corpus(small, sample_tokenizer, 100, m30k_encoded.path.parent)
    assert other.path != m30k_encoded.path
    src, tgt = other.pair(7)
    assert (
        sample_tokenizer.decode(src) == multi30k_train.src[7] and sample_tokenizer.decode(tgt) == multi30k_train.tgt[7]
    )


def test_grouping_by_length_keeps_padding_low(m30k_encoded: EncodedCorpus) -> None:
    """Below a tenth of the cells, and a small share of what batches of random pairs would pad."""
    batches = make_batches(m30k_encoded, 4096, seed=1, epoch=0)
    fraction = padding_fraction(m30k_encoded, batches)
    shuffled = np.random.default_rng(0).permutation(len(m30k_encoded))
    cuts = np.cumsum([0] + [len(b) for b in batches])
    random = [shuffled[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    assert fraction < 0.10 and fraction < padding_fraction(m30k_encoded, random) / 4


@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_every_batch_fits_the_budget_and_covers_each_pair_once(m30k_encoded: EncodedCorpus, pad_multiple: int) -> None:
    batches = make_batches(m30k_encoded, 2000, seed=3, epoch=2, pad_multiple=pad_multiple)
    src, tgt = padded_sizes(m30k_encoded, pad_multiple)
    for b in batches:
        assert len(b) * src[b].max() <= 2000 and len(b) * tgt[b].max() <= 2000
    assert sorted(i for b in batches for i in b) == list(range(len(m30k_encoded)))
    assert batches.dropped_too_long == 0


def test_same_seed_and_epoch_give_the_same_batches(m30k_encoded: EncodedCorpus) -> None:
    a = make_batches(m30k_encoded, 4096, seed=5, epoch=3)
    assert a == make_batches(m30k_encoded, 4096, seed=5, epoch=3)
    assert a != make_batches(m30k_encoded, 4096, seed=5, epoch=4)
    assert a != make_batches(m30k_encoded, 4096, seed=6, epoch=3)
    fixed = make_batches(m30k_encoded, 4096, seed=5, epoch=3, shuffle=False)
    assert fixed == make_batches(m30k_encoded, 4096, seed=9, epoch=0, shuffle=False)


def test_pairs_over_max_len_or_the_budget_are_dropped_and_counted(sample_tokenizer: Tokenizer, tmp_path: Path) -> None:
    long = " ".join(["Fahrrad"] * 5000)
    corpus = small_corpus([("Ein Mann.", "A man."), (long, "x"), ("Der Hund.", "The dog."), ("ja", long)])
    assert encode_corpus(corpus, sample_tokenizer, 100, tmp_path).dropped_long == 2
    enc = encode_corpus(corpus, sample_tokenizer, 10_000, tmp_path)
    assert len(enc) == 4 and enc.dropped_long == 0
    batches = make_batches(enc, 64, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == [0, 2] and batches.dropped_too_long == 2


def test_collate_builds_teacher_forcing_inputs(sample_tokenizer: Tokenizer, tmp_path: Path) -> None:
    t = sample_tokenizer
    corpus = small_corpus([("Ein Mann fährt Fahrrad.", "A man rides a bike."), ("Ja, bitte.", "Yes, please.")])
    enc = encode_corpus(corpus, t, 100, tmp_path)
    b = collate(enc, [0, 1], t)
    x0, y0, y1 = t.encode(corpus.src[0]), t.encode(corpus.tgt[0]), t.encode(corpus.tgt[1])
    assert b.src[0].tolist() == x0 + [t.end_id]
    assert b.tgt_in[0].tolist() == [t.start_id] + y0 and b.tgt_out[0].tolist() == y0 + [t.end_id]
    assert b.tgt_in[1].tolist() == [t.start_id] + y1 + [t.pad_id] * (len(y0) - len(y1))
    assert b.tgt_out[1].tolist() == y1 + [t.end_id] + [t.pad_id] * (len(y0) - len(y1))
    assert b.src.dtype == b.tgt_in.dtype == torch.long
    assert b.n_tokens == int((b.tgt_out != t.pad_id).sum()) == len(y0) + len(y1) + 2
    padded = collate(enc, [1], t, pad_multiple=8)
    assert (
        padded.src.shape[1] % 8 == 0 and padded.tgt_in.shape == padded.tgt_out.shape and padded.tgt_in.shape[1] % 8 == 0
    )
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_out, b.tgt_out) and moved.n_tokens == b.n_tokens
    assert Batch(b.src, b.tgt_in, b.tgt_out).n_tokens == b.n_tokens


def test_source_tensor_is_ids_then_end_then_padding(sample_tokenizer: Tokenizer) -> None:
    t = sample_tokenizer
    ids = [[5, 6, 7], [8], [9, 10]]
    src = source_tensor(ids, t)
    assert src.dtype == torch.long and src.tolist() == [
        [5, 6, 7, t.end_id],
        [8, t.end_id, t.pad_id, t.pad_id],
        [9, 10, t.end_id, t.pad_id],
    ]
    arrays = [np.array(x, dtype=np.uint16) for x in ids]
    assert torch.equal(source_tensor(arrays, t), src)
    assert source_tensor(ids, t, pad_multiple=8).tolist() == [row + [t.pad_id] * 4 for row in src.tolist()]


def test_collate_source_is_the_source_tensor_of_its_pairs(
    m30k_encoded: EncodedCorpus, multi30k_tokenizer: Tokenizer
) -> None:
    batch = make_batches(m30k_encoded, 2000, seed=1, epoch=0)[0]
    for pad_multiple in (1, 8):
        ids = [m30k_encoded.pair(i)[0] for i in batch]
        expected = source_tensor(ids, multi30k_tokenizer, pad_multiple)
        assert torch.equal(collate(m30k_encoded, batch, multi30k_tokenizer, pad_multiple).src, expected)


def test_sorted_batches_keep_every_line_within_the_budget() -> None:
    lengths = [3, 0, 7, 1, 3, 30, 2, 0, 5]
    batches = list(sorted_batches(lengths, 12))
    assert sorted(i for b in batches for i in b) == [i for i, n in enumerate(lengths) if n]
    assert [lengths[i] for b in batches for i in b] == sorted(n for n in lengths if n)
    for b in batches:
        assert len(b) == 1 or len(b) * (max(lengths[i] for i in b) + 1) <= 12
    assert [5] in batches  # alone over the budget, yet translated


def test_rows_map_encoded_pairs_back_to_the_corpus(sample_tokenizer: Tokenizer, tmp_path: Path) -> None:
    corpus = small_corpus([("a", "b"), (" ".join(["Haus"] * 50), "c"), ("Der Hund.", "The dog.")])
    enc = encode_corpus(corpus, sample_tokenizer, 20, tmp_path)
    assert enc.rows.tolist() == [0, 2]
    assert sample_tokenizer.decode(enc.pair(1)[0]) == corpus.src[2]


@pytest.mark.slow
def test_two_million_pairs_stay_far_below_their_python_size(tmp_path: Path) -> None:
    """Prepare a generated 2M-pair corpus end to end in a fresh process and report its peak RSS."""
    script = textwrap.dedent(
        f"""
        import random, resource, sys
        from pathlib import Path
        import datasets
        from transformer.config import DataConfig, TokenizerConfig
        from transformer.text.corpus import load_split
        from transformer.text.tokenizer import train_tokenizer
        from transformer.text.batching import collate, encode_corpus, make_batches
        tmp = Path({str(tmp_path)!r})
        datasets.config.HF_DATASETS_CACHE = str(tmp / "hf")
        rng = random.Random(0)
        words = [f"w{{i}}" for i in range(3000)]
        with open(tmp / "train.de", "w") as de, open(tmp / "train.en", "w") as en:
            for _ in range(2_000_000):
                de.write(" ".join(rng.choices(words, k=rng.randint(3, 14))) + "\\n")
                en.write(" ".join(rng.choices(words, k=rng.randint(3, 14))) + "\\n")
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        corpus = load_split(DataConfig(format="text", path=str(tmp)), "train")
        tok = train_tokenizer(TokenizerConfig(vocab_size=4000, train_sample=100_000), corpus)
        enc = encode_corpus(corpus, tok, 100, tmp / "ids")
        batches = make_batches(enc, 4096, seed=1, epoch=0)
        for b in batches[:20]:
            collate(enc, b, tok)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        anon, mapped = (int(status[k].split()[0]) for k in ("RssAnon", "RssFile"))
        every = range(0, len(corpus), 1000)
        sample = [corpus.src[i] for i in every] + [corpus.tgt[i] for i in every]
        ids = [tok.encode(s) for s in sample]
        size = sum(map(sys.getsizeof, sample)) + sum(sys.getsizeof(x) + 28 * len(x) for x in ids)
        per_pair = 2 * size / len(sample)
        print(len(corpus), len(enc), len(batches), base, peak, anon, mapped, int(per_pair * len(corpus)) // 1024)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    n, kept, n_batches, *kib = map(int, out.stdout.split())
    base, peak, anon, mapped, python = (k / 1024 for k in kib)
    print(
        f"\n{n:,} pairs -> {n_batches:,} batches; peak RSS {peak:,.0f} MiB, {base:,.0f} MiB of it imports; "
        f"at the end {anon:,.0f} MiB anonymous + {mapped:,.0f} MiB file-backed (memory-mapped Arrow, libraries); "
        f"the same corpus as Python strings and id lists: {python:,.0f} MiB"
    )
    assert n == kept == 2_000_000
    assert peak - base < python / 3


@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_static_collate_adds_empty_rows_up_to_static_rows(
    m30k_encoded: EncodedCorpus, multi30k_tokenizer: Tokenizer, pad_multiple: int
) -> None:
    """Rows of nothing but <PAD> up to static_rows, after the real rows, which are those of a plain collate."""
    t = multi30k_tokenizer
    batches = make_batches(m30k_encoded, 2000, seed=2, epoch=0, pad_multiple=pad_multiple)
    grew = 0
    for b in batches:
        plain = collate(m30k_encoded, b, t, pad_multiple)
        static = collate(m30k_encoded, b, t, pad_multiple, static_tokens=2000)
        S, T = plain.src.size(1), plain.tgt_in.size(1)
        rows = static_rows(2000, S, T)
        assert rows >= len(b)  # the batch fits the budget it was cut to, so no real row is lost
        assert static.src.shape == (rows, S) and static.tgt_in.shape == static.tgt_out.shape == (rows, T)
        for name in ("src", "tgt_in", "tgt_out"):
            real, extra = getattr(static, name)[: len(b)], getattr(static, name)[len(b) :]
            assert torch.equal(real, getattr(plain, name))
            assert bool((extra == t.pad_id).all())
        assert static.n_tokens == plain.n_tokens == int((static.tgt_out != t.pad_id).sum())
        assert static.src.dtype == static.tgt_in.dtype == static.tgt_out.dtype == torch.long
        grew += rows > len(b)
    assert grew  # some batch (the last of a length) did get empty rows


def test_static_rows_fill_the_budget_with_the_longer_side() -> None:
    assert static_rows(2000, 10, 20) == 100 and static_rows(2000, 20, 10) == 100 and static_rows(2000, 30, 7) == 66
    assert static_rows(100, 150, 3) == 1  # a batch holds at least one row


def test_static_collate_never_drops_a_row_of_a_batch_over_its_budget(
    sample_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    t = sample_tokenizer
    corpus = small_corpus(
        [("Ein Mann fährt Fahrrad.", "A man rides a bike."), ("Ja, bitte.", "Yes, please."), ("Der Hund.", "The dog.")]
    )
    enc = encode_corpus(corpus, t, 100, tmp_path)
    plain = collate(enc, [0, 1, 2], t)
    static = collate(enc, [0, 1, 2], t, static_tokens=4)  # static_rows is 1 here
    assert static_rows(4, plain.src.size(1), plain.tgt_in.size(1)) == 1
    for name in ("src", "tgt_in", "tgt_out"):
        assert torch.equal(getattr(static, name), getattr(plain, name))
    assert static.n_tokens == plain.n_tokens


@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_padding_fraction_counts_the_empty_rows_of_static_batches(
    m30k_encoded: EncodedCorpus, multi30k_tokenizer: Tokenizer, pad_multiple: int
) -> None:
    """At least the plain fraction, and the share of <PAD> cells in the collated source and target tensors."""
    batches = make_batches(m30k_encoded, 2000, seed=4, epoch=1, pad_multiple=pad_multiple)
    plain = padding_fraction(m30k_encoded, batches, pad_multiple)
    static = padding_fraction(m30k_encoded, batches, pad_multiple, static_tokens=2000)
    assert 0 <= plain < static < 1  # the last batch of a length is not full: it gets empty rows
    pads = cells = 0
    for b in batches:
        batch = collate(m30k_encoded, b, multi30k_tokenizer, pad_multiple, static_tokens=2000)
        pads += int((batch.src == multi30k_tokenizer.pad_id).sum() + (batch.tgt_out == multi30k_tokenizer.pad_id).sum())
        cells += batch.src.numel() + batch.tgt_out.numel()
    assert static == pytest.approx(pads / cells)


def test_a_damaged_token_cache_is_encoded_again(sample_cfg, sample_tokenizer, tmp_path):
    """The cache is tfm's own derived data: a torn or garbled file is made anew, not a traceback."""
    corpus = load_split(sample_cfg, "valid")
    first = encode_corpus(corpus, sample_tokenizer, 100, tmp_path)
    n, pair, path = len(first), first.pair(3), first.path
    path.write_bytes(path.read_bytes()[:100])
    again = encode_corpus(corpus, sample_tokenizer, 100, tmp_path)
    assert len(again) == n and again.pair(3) == pair
    path.with_suffix(".json").write_text("{not json")
    assert encode_corpus(corpus, sample_tokenizer, 100, tmp_path).pair(3) == pair
