"""Parallel corpora: ``load_split`` turns one split of any source into a ``Corpus``.

The sources are local files (``formats``: text pairs, TSV, JSONL; ``multi30k``) and Hugging Face
datasets (``hub``). Here, whatever the source, pairs with an empty side are dropped and counted,
``data.lowercase`` is applied, a fingerprint names the content for caches, and ``data.holdout``
cuts one corpus into train/valid/test. Small local corpora become Python lists; larger ones (over
``ARROW_ABOVE_BYTES`` of text) are streamed once into a memory-mapped Arrow file
(``arrow_files``), and Hugging Face datasets stay in their own Arrow files, so a WMT-sized corpus
never sits in memory as Python strings.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.text.arrow_files import ARROW_ROWS, cached_pairs
from transformer.text.formats import Pairs, one_file, pair_files, read_jsonl, read_text, read_tsv
from transformer.text.hub import read_hub
from transformer.text.multi30k import check_folder, read_multi30k

ARROW_ABOVE_BYTES = 64 * 2**20
_GZ_RATIO = 4  # how much larger than its file a gzipped corpus is, roughly, as text
_READERS = {"multi30k": read_multi30k, "text": read_text, "tsv": read_tsv, "jsonl": read_jsonl}


@dataclass
class Corpus:
    """One split of parallel text: ``src[i]`` translates to ``tgt[i]``."""

    src: Sequence[str]
    tgt: Sequence[str]
    name: str
    dropped_empty: int = 0
    fingerprint: str = ""  # identifies the content for caches; "" means hash the text when needed
    split_record: dict[str, object] | None = None  # how data.holdout cut this split (see _holdout)

    def __len__(self) -> int:
        return len(self.src)


class ArrowColumn(Sequence[str]):
    """Strings of one Arrow column, optionally seen through a row index and lower-cased on access."""

    def __init__(self, column: pa.ChunkedArray, rows: np.ndarray | None = None, lowercase: bool = False) -> None:
        self._col = column
        self._rows = rows
        self._lower = lowercase

    def __len__(self) -> int:
        return len(self._col) if self._rows is None else len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self._many(range(len(self))[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        return self._fix(self._col[i if self._rows is None else int(self._rows[i])].as_py())

    def __iter__(self) -> Iterator[str]:
        for j in range(0, len(self), ARROW_ROWS):
            yield from self[j : j + ARROW_ROWS]

    def subset(self, rows: np.ndarray) -> ArrowColumn:
        """The strings at positions ``rows`` of this column, without copying them."""
        return ArrowColumn(self._col, rows if self._rows is None else self._rows[rows], self._lower)

    def _many(self, idx: range) -> list[str]:
        if self._rows is None and idx.step == 1:
            values = self._col.slice(idx.start, len(idx)).to_pylist()
        else:
            pos = np.arange(idx.start, idx.stop, idx.step)
            values = self._col.take(pa.array(pos if self._rows is None else self._rows[pos])).to_pylist()
        return [self._fix(v) for v in values]

    def _fix(self, value: str | None) -> str:
        value = value or ""
        return value.lower() if self._lower else value


def load_split(cfg: DataConfig, split: str) -> Corpus:
    """Load one split (``cfg.train_split``, ``valid_split``, ``test_split`` or another name) of the corpus."""
    if cfg.holdout:
        return _holdout(cfg, split)
    if cfg.format == "hf":
        return _hf(cfg, split)
    if cfg.format not in _READERS:
        raise DataError(f"data.format '{cfg.format}' is unknown; use one of {', '.join([*_READERS, 'hf'])}")
    pairs, files = _READERS[cfg.format](cfg, split)
    return _collect(pairs, cfg, split, files)


def locate(cfg: DataConfig) -> None:
    """Refuse, before anything slow, a local corpus whose training files are not where ``cfg`` says (a DataError
    naming them); reads nothing and makes nothing."""
    if cfg.format == "multi30k":
        check_folder(Path(os.environ.get("TFM_MULTI30K") or cfg.path))
    elif cfg.format == "text":
        pair_files(Path(cfg.path), cfg.train_split, cfg)
    elif cfg.format in ("tsv", "jsonl"):
        one_file(cfg, cfg.train_split, cfg.format)


def _holdout(cfg: DataConfig, split: str) -> Corpus:
    """Cut one corpus (its train split) into train/valid/test with a seeded permutation.

    The cut depends only on the number of pairs and ``split_seed``, never on the direction, so
    en->zh and zh->en runs on one file hold out the same pairs. ``split_record`` writes it down:
    sizes, seed and a SHA-256 of each held-out split's row numbers, for the run directory.
    """
    names = [cfg.train_split, cfg.valid_split, cfg.test_split]
    if split not in names:
        raise DataError(f"split '{split}' is unknown with data.holdout; use one of {', '.join(names)}")
    full = load_split(replace(cfg, holdout=None), cfg.train_split)
    n_valid, n_test = cfg.holdout or (0, 0)
    if n_valid + n_test >= len(full):
        raise DataError(f"data.holdout {cfg.holdout} leaves no training pairs out of {len(full)}; make it smaller")
    perm = np.random.default_rng(cfg.split_seed).permutation(len(full))
    part = {cfg.valid_split: perm[:n_valid], cfg.test_split: perm[n_valid : n_valid + n_test]}
    rows = np.sort(part.get(split, perm[n_valid + n_test :]))
    key = _hash([full.fingerprint, split, cfg.split_seed, cfg.holdout])
    dropped = full.dropped_empty if split == cfg.train_split else 0
    record = {
        "path": cfg.path,
        "pairs": len(full),
        "dropped_empty": full.dropped_empty,
        "split_seed": cfg.split_seed,
        "method": "numpy.random.default_rng(split_seed).permutation(pairs): valid first, then test, rest train",
        "sizes": {cfg.train_split: len(full) - n_valid - n_test, cfg.valid_split: n_valid, cfg.test_split: n_test},
        "rows_sha256": {name: _rows_hash(part[name]) for name in (cfg.valid_split, cfg.test_split)},
    }
    return Corpus(_subset(full.src, rows), _subset(full.tgt, rows), f"{cfg.format}:{split}", dropped, key, record)


def _rows_hash(rows: np.ndarray) -> str:
    """SHA-256 of sorted 0-based row numbers (of the pairs left after empty ones are dropped), comma-joined."""
    return hashlib.sha256(",".join(map(str, np.sort(rows).tolist())).encode()).hexdigest()


def _subset(seq: Sequence[str], rows: np.ndarray) -> Sequence[str]:
    if isinstance(seq, ArrowColumn):
        return seq.subset(rows)
    return [seq[i] for i in rows.tolist()]


# ---- cleaning and collecting pairs ----------------------------------------------------------------


def _hash(parts: Iterable[object]) -> str:
    return hashlib.sha256(json.dumps(list(parts), default=str).encode()).hexdigest()[:32]


def _clean(pairs: Iterable[tuple[str, str]], lowercase: bool) -> Iterator[tuple[str, str] | None]:
    """The pairs, lower-cased if asked; ``None`` in place of a pair with an empty or blank side."""
    for s, t in pairs:
        if not s.strip() or not t.strip():
            yield None
        else:
            yield (s.lower(), t.lower()) if lowercase else (s, t)


def _collect(pairs: Pairs, cfg: DataConfig, split: str, files: list[Path]) -> Corpus:
    """Gather pairs into lists, or into a cached Arrow file when the files are large."""
    name = f"{cfg.format}:{split}"
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = _hash([name, stats, cfg.src_lang, cfg.tgt_lang, cfg.hf_field, cfg.tsv_columns, cfg.lowercase])
    size = sum(f.stat().st_size * (_GZ_RATIO if f.suffix == ".gz" else 1) for f in files)
    if size > ARROW_ABOVE_BYTES:
        table, dropped = cached_pairs(_clean(pairs, cfg.lowercase), name, key)
        return Corpus(ArrowColumn(table["src"]), ArrowColumn(table["tgt"]), name, dropped, key)
    src: list[str] = []
    tgt: list[str] = []
    dropped = 0
    for pair in _clean(pairs, cfg.lowercase):
        if pair is None:
            dropped += 1
        else:
            src.append(pair[0])
            tgt.append(pair[1])
    return Corpus(src, tgt, name, dropped, key)


def _hf(cfg: DataConfig, split: str) -> Corpus:
    """A ``datasets`` split, seen through the rows where both sides have text (nothing copied)."""
    src, tgt, fingerprint = read_hub(cfg, split)
    keep = _nonblank(src) & _nonblank(tgt)
    rows = None if keep.all() else np.flatnonzero(keep)
    key = _hash([fingerprint, split, cfg.src_lang, cfg.tgt_lang, cfg.hf_field, cfg.lowercase])
    return Corpus(
        ArrowColumn(src, rows, cfg.lowercase),
        ArrowColumn(tgt, rows, cfg.lowercase),
        f"hf:{split}",
        int((~keep).sum()),
        key,
    )


def _nonblank(column: pa.ChunkedArray) -> np.ndarray:
    """True where a string has a non-whitespace character (nulls count as blank), chunk by chunk."""
    parts = [
        pc.fill_null(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(c)), 0), False).to_numpy(zero_copy_only=False)
        for c in column.chunks
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
