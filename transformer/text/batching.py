"""Token ids of a corpus, batches sized by tokens, and the padded tensors the model eats.

``encode_corpus`` encodes a corpus once, in batches, into an Arrow file keyed by the corpus,
the tokenizer fingerprint and ``max_len``; later runs memory-map it. ``make_batches`` groups
pairs of similar length so that a batch's padded size fits the token budget, from length arrays
alone; ``sorted_batches`` does the same for translation, where no line may be dropped.
``source_tensor`` is the one place a source becomes the model's input, ``x + <END>`` right-padded,
for training (``collate``), translation and the attention pictures; ``collate`` adds the target's
``tgt_in = <START> + y`` and ``tgt_out = y + <END>``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.text.arrow_files import open_arrow, write_arrow, write_json
from transformer.text.corpus import Corpus
from transformer.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

ENCODE_CHUNK = 8192
_CACHE_FORMAT = 1


@dataclass
class Batch:
    """Right-padded ``[B, S]`` source (x + <END>), ``[B, T]`` decoder input (<START> + y) and target (y + <END>)."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_tokens: int | None = None  # non-pad target tokens, known on the CPU when collate builds the batch

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on ``device``; non_blocking to CUDA goes through pinned memory, so the copy is async."""
        pin = non_blocking and torch.device(device).type == "cuda" and self.src.device.type == "cpu"
        b = self.pin_memory() if pin else self
        return Batch(*(t.to(device, non_blocking=non_blocking) for t in (b.src, b.tgt_in, b.tgt_out)), self.n_tokens)

    def pin_memory(self) -> Batch:
        """The same batch in page-locked host memory, which a CUDA copy reads without waiting (already pinned
        tensors are not copied again)."""
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(), self.n_tokens)

    @property
    def longest(self) -> int:
        """Positions in the longest padded sequence, source or target (what attention kernels are chosen by)."""
        return max(self.src.size(1), self.tgt_in.size(1))

    @property
    def n_tokens(self) -> int:
        """Non-pad target tokens (the loss's normaliser); counted from lengths, so no device sync."""
        if self.tgt_tokens is None:
            self.tgt_tokens = int((self.tgt_out != Tokenizer.PAD_ID).sum())
        return self.tgt_tokens


class _Ids:
    """One side's token ids as zero-copy numpy views of the memory-mapped Arrow chunks."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self.values = [c.values.to_numpy() for c in column.chunks]
        self.offsets = [c.offsets.to_numpy() for c in column.chunks]
        self.starts = np.cumsum([0] + [len(c) for c in column.chunks])
        self.lengths = np.concatenate([np.diff(o).astype(np.int32) for o in self.offsets] or [np.zeros(0, np.int32)])

    def runs(self, idx: np.ndarray) -> list[np.ndarray]:
        """The ids of each row in ``idx``, as views of the mapped chunks."""
        chunk = np.searchsorted(self.starts, idx, side="right") - 1
        local = idx - self.starts[chunk]
        return [
            self.values[c][self.offsets[c][r] : self.offsets[c][r + 1]] for c, r in zip(chunk.tolist(), local.tolist())
        ]

    def gather(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of rows ``idx`` concatenated, and their lengths (both int64)."""
        return np.concatenate(self.runs(idx)).astype(np.int64), self.lengths[idx].astype(np.int64)


class EncodedCorpus:
    """Token ids of a corpus's kept pairs in a memory-mapped Arrow table; their lengths in memory."""

    def __init__(
        self, table: pa.Table, dropped_long: int, path: Path | None = None, directions: np.ndarray | None = None
    ) -> None:
        self.table = table
        self.path = path
        self.dropped_long = dropped_long
        self.src = _Ids(table["src"])
        self.tgt = _Ids(table["tgt"])
        self.src_lengths: np.ndarray = self.src.lengths
        self.tgt_lengths: np.ndarray = self.tgt.lengths
        self.rows: np.ndarray = table["row"].to_numpy()  # position of each pair in the Corpus
        # for several directions in one (``joined``): each pair's direction, an index into the parts joined
        self.directions = directions

    @classmethod
    def joined(cls, parts: Sequence[EncodedCorpus]) -> EncodedCorpus:
        """The pairs of ``parts`` one after another (nothing copied), each pair labelled with its part's index."""
        table = pa.concat_tables([p.table for p in parts])
        directions = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        return cls(table, sum(p.dropped_long for p in parts), None, directions)

    def __len__(self) -> int:
        return self.table.num_rows

    def pair(self, i: int) -> tuple[list[int], list[int]]:
        """Source and target ids of pair ``i``."""
        idx = np.array([i])
        return self.src.gather(idx)[0].tolist(), self.tgt.gather(idx)[0].tolist()


class Batches(Sequence[list[int]]):
    """``make_batches``' index lists, made on demand from one index array (no Python list of the corpus).

    Behaves as a read-only ``list[list[int]]`` (len, indexing, slicing, iteration, ==) and also
    tells how many pairs could not fit the token budget.
    """

    def __init__(self, order: np.ndarray, cuts: np.ndarray, sequence: np.ndarray, dropped_too_long: int = 0) -> None:
        self._order = order
        self._cuts = cuts
        self._sequence = sequence
        self.dropped_too_long = dropped_too_long

    def __len__(self) -> int:
        return len(self._sequence)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[j] for j in range(len(self))[k]]
        b = int(self._sequence[k])
        return self._order[self._cuts[b] : self._cuts[b + 1]].tolist()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]


def _corpus_key(corpus: Corpus) -> str:
    """The corpus fingerprint, or a hash of its text when it has none."""
    if corpus.fingerprint:
        return corpus.fingerprint
    h = hashlib.sha256()
    for s, t in zip(corpus.src, corpus.tgt):
        h.update(f"{s}\t{t}\n".encode())
    return h.hexdigest()


def encode_corpus(
    corpus: Corpus, tokenizer: Tokenizer, max_len: int, cache_dir: str | Path, src_prefix: Sequence[int] = ()
) -> EncodedCorpus:
    """Token ids of ``corpus``, each source after ``src_prefix`` (a target-language tag), computed once and cached;
    pairs with a side over ``max_len`` tokens dropped."""
    parts = [_CACHE_FORMAT, _corpus_key(corpus), tokenizer.fingerprint(), max_len]
    parts += [list(src_prefix)] if src_prefix else []
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
    path = Path(cache_dir) / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', corpus.name)}-{key}.arrow"
    meta = path.with_suffix(".json")
    if meta.is_file() and path.is_file():
        try:
            return EncodedCorpus(open_arrow(path), int(json.loads(meta.read_text())["dropped_long"]), path)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):  # tfm's own cache, damaged: made anew
            log.warning("%s: its cached token ids in %s are damaged; encoding it again", corpus.name, path)
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    schema = pa.schema(
        [
            ("src", pa.list_(pa.from_numpy_dtype(dtype))),
            ("tgt", pa.list_(pa.from_numpy_dtype(dtype))),
            ("row", pa.int64()),
        ]
    )
    dropped = 0

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal dropped
        for start in range(0, len(corpus), ENCODE_CHUNK):
            src = [[*src_prefix, *ids] for ids in tokenizer.encode_batch(corpus.src[start : start + ENCODE_CHUNK])]
            tgt = tokenizer.encode_batch(corpus.tgt[start : start + ENCODE_CHUNK])
            keep = (_lengths(src) <= max_len) & (_lengths(tgt) <= max_len)
            dropped += int((~keep).sum())
            rows = np.flatnonzero(keep)
            yield pa.record_batch(
                [_list_array(src, rows, dtype), _list_array(tgt, rows, dtype), pa.array(rows + start)], schema=schema
            )

    write_arrow(path, schema, batches())
    write_json(meta, {"name": corpus.name, "dropped_long": dropped, "max_len": max_len})
    if dropped:
        log.warning("%s: dropped %d pairs longer than max_len=%d tokens", corpus.name, dropped, max_len)
    return EncodedCorpus(open_arrow(path), dropped, path)


def _lengths(ids: list[list[int]]) -> np.ndarray:
    return np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))


def _list_array(ids: list[list[int]], rows: np.ndarray, dtype: type) -> pa.ListArray:
    """The id lists at ``rows`` as one Arrow list array, built from a flat buffer and offsets."""
    kept = [ids[i] for i in rows.tolist()]
    offsets = np.zeros(len(kept) + 1, dtype=np.int32)
    np.cumsum(_lengths(kept), out=offsets[1:])
    values = np.fromiter(chain.from_iterable(kept), dtype=dtype, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _round_up(n: np.ndarray, multiple: int) -> np.ndarray:
    return -(-n // multiple) * multiple


def padded_sizes(data: EncodedCorpus, pad_multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, the padded source and target length a batch must hold (each +1 for <END> or <START>)."""
    return _round_up(data.src_lengths + 1, pad_multiple), _round_up(data.tgt_lengths + 1, pad_multiple)


def make_batches(
    data: EncodedCorpus,
    batch_tokens: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    pad_multiple: int = 1,
    pairs: np.ndarray | None = None,
) -> Batches:
    """Index lists of pairs grouped by length, each with ``n x longest <= batch_tokens`` on both sides: of every pair
    once, or of ``pairs`` (the epoch's draw of several directions, a pair possibly more than once).

    The same (seed, epoch) gives the same list, so a resumed run re-makes it and skips the batches
    it has done. A pair that alone exceeds the budget is dropped, counted and logged.
    """
    src, tgt = padded_sizes(data, pad_multiple)
    size = np.maximum(src, tgt)  # n x max(S, T) <= budget  <=>  both n x S and n x T <= budget
    idx = np.flatnonzero(size <= batch_tokens).astype(np.int32)
    if pairs is not None:
        idx = pairs[size[pairs] <= batch_tokens].astype(np.int32)
    dropped = (len(size) if pairs is None else len(pairs)) - len(idx)
    if dropped:
        log.warning("%d pairs longer than batch_tokens=%d dropped from the batches", dropped, batch_tokens)
    rng = np.random.default_rng([seed, epoch])
    if shuffle:
        idx = rng.permutation(idx)
    order = idx[np.lexsort((tgt[idx], src[idx], size[idx]))]  # stable: equal lengths keep the shuffled order
    cuts = _cut(size[order], batch_tokens)
    sequence = rng.permutation(len(cuts) - 1) if shuffle else np.arange(len(cuts) - 1)
    return Batches(order, cuts, sequence, dropped)


def sorted_batches(lengths: Sequence[int], batch_tokens: int) -> Iterator[list[int]]:
    """Indices of the non-empty sources (``lengths`` without <END>), shortest first, cut so that each
    batch's ``n x longest`` (with <END>) stays within ``batch_tokens``.

    For translation: a source that alone exceeds the budget gets a batch of its own, since every
    line must be answered.
    """
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: lengths[i])
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * (lengths[i] + 1) > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _cut(sizes: np.ndarray, budget: int) -> np.ndarray:
    """Greedy boundaries over non-decreasing ``sizes`` so that each run's count x last size <= budget."""
    cuts, p, n = [0], 0, len(sizes)
    while p < n:
        count = min(budget // int(sizes[p]), n - p)
        largest = int(sizes[p + count - 1])
        if count * largest > budget:
            count = budget // largest
        p += count
        cuts.append(p)
    return np.array(cuts, dtype=np.int64)


def padding_fraction(
    data: EncodedCorpus, batches: Sequence[Sequence[int]], pad_multiple: int = 1, static_tokens: int | None = None
) -> float:
    """Share of the batches' tensor cells (source and target) that are padding, empty rows of
    ``collate(..., static_tokens)`` included."""
    real = padded = 0
    for b in batches:
        i = np.asarray(b)
        s, t = data.src_lengths[i] + 1, data.tgt_lengths[i] + 1
        S, T = int(_round_up(s.max(), pad_multiple)), int(_round_up(t.max(), pad_multiple))
        rows = len(i) if static_tokens is None else max(len(i), static_rows(static_tokens, S, T))
        real += int(s.sum() + t.sum())
        padded += rows * (S + T)
    return 1 - real / padded if padded else 0.0


def _padded(values: np.ndarray, lengths: np.ndarray, width: int, pad: int, offset: int = 0) -> np.ndarray:
    """``[B, width]`` array whose row i is ``offset`` cells of pad, the i-th run of ``values``, then pad."""
    out = np.full((len(lengths), width), pad, dtype=np.int64)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(np.arange(len(lengths)), lengths), np.arange(len(values)) - starts + offset] = values
    return out


def source_tensor(ids: Sequence[Sequence[int]], tokenizer: Tokenizer, pad_multiple: int = 1) -> Tensor:
    """The model's ``[B, S]`` long source: row i is ``ids[i] + <END>``, then <PAD> up to the longest
    row rounded up to ``pad_multiple``."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    values = np.concatenate(ids).astype(np.int64, copy=False)
    src = _padded(values, lengths, int(_round_up(lengths.max() + 1, pad_multiple)), tokenizer.pad_id)
    src[np.arange(len(lengths)), lengths] = tokenizer.end_id
    return torch.from_numpy(src)


def static_rows(batch_tokens: int, src_len: int, tgt_len: int) -> int:
    """Rows of a batch of static shape: as many sequences of the longer side's padded length as the budget holds."""
    return max(1, batch_tokens // max(src_len, tgt_len))


def collate(
    data: EncodedCorpus,
    indices: Sequence[int],
    tokenizer: Tokenizer,
    pad_multiple: int = 1,
    static_tokens: int | None = None,
) -> Batch:
    """The batch of pairs ``indices``: source + <END>, <START> + target, target + <END>, right-padded.

    With ``static_tokens`` the batch also gets rows of nothing but <PAD> up to ``static_rows``, so
    that its shape depends on its padded lengths alone and repeats from batch to batch (what a CUDA
    graph or a compiled kernel of one shape needs). Empty rows add nothing to the loss or the gradients.
    """
    idx = np.asarray(indices, dtype=np.int64)
    src = source_tensor(data.src.runs(idx), tokenizer, pad_multiple)
    tgt_values, tgt_len = data.tgt.gather(idx)
    pad = tokenizer.pad_id
    width = int(_round_up(tgt_len.max() + 1, pad_multiple))
    tgt_in = _padded(tgt_values, tgt_len, width, pad, offset=1)
    tgt_in[:, 0] = tokenizer.start_id
    tgt_out = _padded(tgt_values, tgt_len, width, pad)
    tgt_out[np.arange(len(tgt_len)), tgt_len] = tokenizer.end_id
    tgt_in, tgt_out = torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)
    if static_tokens is not None:
        extra = static_rows(static_tokens, src.size(1), width) - len(idx)
        src, tgt_in, tgt_out = (F.pad(t, (0, 0, 0, max(extra, 0)), value=pad) for t in (src, tgt_in, tgt_out))
    return Batch(src, tgt_in, tgt_out, int(tgt_len.sum()) + len(tgt_len))
