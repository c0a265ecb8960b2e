"""Parallel corpora: local files (text pairs, TSV, JSONL, Multi30k) and Hugging Face datasets.

``load_split`` returns a ``Corpus``: the aligned source and target strings of one split, with
pairs that have an empty side dropped and counted. Small local corpora become Python lists;
larger ones (over ``ARROW_ABOVE_BYTES`` of text) are streamed once into a memory-mapped Arrow
file in the ``datasets`` cache, and Hugging Face datasets stay in their own Arrow files, so a
WMT-sized corpus never sits in memory as Python strings. Every problem is a ``DataError`` whose
one-line message names the file (and line) and the fix.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import chain, zip_longest
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.files import atomic_file

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
ARROW_ABOVE_BYTES = 64 * 2**20
_ARROW_ROWS = 50_000
_GZ_RATIO = 4


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
        for j in range(0, len(self), _ARROW_ROWS):
            yield from self[j : j + _ARROW_ROWS]

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
    loaders = {"multi30k": _multi30k, "text": _text, "tsv": _tsv, "jsonl": _jsonl, "hf": _hf}
    if cfg.format not in loaders:
        raise DataError(f"data.format '{cfg.format}' is unknown; use one of {', '.join(loaders)}")
    return loaders[cfg.format](cfg, split)


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


# ---- local files -------------------------------------------------------------------------------


def _find(folder: Path, stem: str) -> Path | None:
    """``folder/stem`` or ``folder/stem.gz``, whichever exists."""
    for p in (folder / stem, folder / f"{stem}.gz"):
        if p.is_file():
            return p
    return None


def _lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 text file (gzip if it ends in .gz), without line ends or a leading BOM."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{path}:{n}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                        "convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8"
                    ) from None
                yield (line[1:] if n == 1 and line.startswith("\ufeff") else line).rstrip("\r\n")
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e}); check that the file is complete and readable") from None


def _text_pairs(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """Line-aligned pairs of two files; different line counts are an error naming both counts."""
    n_src = n_tgt = 0
    for s, t in zip_longest(_lines(src), _lines(tgt)):
        n_src += s is not None
        n_tgt += t is not None
        if s is not None and t is not None:
            yield s, t
    if n_src != n_tgt:
        raise DataError(
            f"{src} has {n_src} lines but {tgt} has {n_tgt}; the files must be line-aligned translations of each other"
        )


def _tsv_pairs(path: Path, cfg: DataConfig) -> Iterator[tuple[str, str]]:
    """Pairs from tab-separated columns, found by a header row naming the languages, else by
    ``data.tsv_columns`` (so one header-less file serves both directions), else source then target."""
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        return
    header = [c.strip().lower() for c in first.split("\t")]
    if cfg.src_lang in header and cfg.tgt_lang in header:
        i, j, start, body = header.index(cfg.src_lang), header.index(cfg.tgt_lang), 2, lines
    else:
        order = cfg.tsv_columns or [cfg.src_lang, cfg.tgt_lang]
        i, j, start, body = order.index(cfg.src_lang), order.index(cfg.tgt_lang), 1, chain([first], lines)
    for n, line in enumerate(body, start):
        cols = line.split("\t")
        if not line.strip():
            yield "", ""
        elif len(cols) <= max(i, j):
            raise DataError(
                f"{path}:{n}: expected tab-separated {cfg.src_lang} and {cfg.tgt_lang} columns, "
                f"found {len(cols)} column(s); separate the two sentences with one tab"
            )
        else:
            yield cols[i], cols[j]


def _jsonl_pairs(path: Path, cfg: DataConfig) -> Iterator[tuple[str, str]]:
    """Pairs from one JSON object per line, e.g. {"de": ..., "en": ...} (inside cfg.hf_field if set)."""
    where = f" inside '{cfg.hf_field}'" if cfg.hf_field else ""
    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            yield "", ""
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not valid JSON ({e.msg}); write one object per line") from None
        if cfg.hf_field and isinstance(obj, dict):
            obj = obj.get(cfg.hf_field)
        if not isinstance(obj, dict) or cfg.src_lang not in obj or cfg.tgt_lang not in obj:
            found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise DataError(
                f"{path}:{n}: expected keys '{cfg.src_lang}' and '{cfg.tgt_lang}'{where}, found {found}; "
                "fix the line or set data.src_lang/tgt_lang (and data.hf_field)"
            )
        s, t = obj[cfg.src_lang], obj[cfg.tgt_lang]
        if not all(isinstance(x, str) or x is None for x in (s, t)):
            raise DataError(f"{path}:{n}: '{cfg.src_lang}' and '{cfg.tgt_lang}' must be strings; fix the line")
        yield s or "", t or ""


def _pair_files(folder: Path, split: str, cfg: DataConfig) -> tuple[Path, Path]:
    """``{split}.{src_lang}`` and ``{split}.{tgt_lang}`` (``.gz`` allowed); DataError naming any missing."""
    src, tgt = (_find(folder, f"{split}.{lang}") for lang in (cfg.src_lang, cfg.tgt_lang))
    if src is None or tgt is None:
        missing = [f"{split}.{lang}[.gz]" for lang, f in ((cfg.src_lang, src), (cfg.tgt_lang, tgt)) if f is None]
        raise DataError(f"missing {', '.join(missing)} in {folder}; put one sentence per line there or fix data.path")
    return src, tgt


def _text(cfg: DataConfig, split: str) -> Corpus:
    src, tgt = _pair_files(Path(cfg.path), split, cfg)
    return _collect(_text_pairs(src, tgt), cfg, split, [src, tgt])


def _one_file(cfg: DataConfig, split: str, ext: str) -> Path:
    """The file holding ``split``: cfg.path itself (train split only) or ``{path}/{split}.{ext}[.gz]``."""
    p = Path(cfg.path)
    if p.is_file():
        if split != cfg.train_split:
            raise DataError(
                f"{p} is a single file, so it has no '{split}' split; set data.holdout: [n_valid, n_test] "
                f"or point data.path at a folder with {split}.{ext}"
            )
        return p
    found = _find(p, f"{split}.{ext}")
    if found is None:
        raise DataError(f"missing {split}.{ext} in {p}; create it or fix data.path")
    return found


def _tsv(cfg: DataConfig, split: str) -> Corpus:
    path = _one_file(cfg, split, "tsv")
    return _collect(_tsv_pairs(path, cfg), cfg, split, [path])


def _jsonl(cfg: DataConfig, split: str) -> Corpus:
    path = _one_file(cfg, split, "jsonl")
    return _collect(_jsonl_pairs(path, cfg), cfg, split, [path])


def _multi30k(cfg: DataConfig, split: str) -> Corpus:
    """Multi30k task 1 from TFM_MULTI30K or cfg.path, downloading missing files from the official repository."""
    folder = Path(os.environ.get("TFM_MULTI30K") or cfg.path)
    langs = (cfg.src_lang, cfg.tgt_lang)
    missing = [f"{split}.{lang}.gz" for lang in langs if _find(folder, f"{split}.{lang}") is None]
    for i, name in enumerate(missing):
        try:
            _download(f"{MULTI30K_URL}/{name}", folder / name)
        except OSError as e:
            raise DataError(
                f"Multi30k files missing in {folder}: {', '.join(missing[i:])} (download failed: {_reason(e)}); "
                f"put them there from {MULTI30K_URL}/ or set TFM_MULTI30K to a folder that has them"
            ) from None
    src, tgt = _pair_files(folder, split, cfg)
    return _collect(_text_pairs(src, tgt), cfg, split, [src, tgt])


def _download(url: str, dest: Path) -> None:
    """Fetch ``url`` into ``dest`` through a temporary file, so a failed download leaves nothing behind."""
    with atomic_file(dest, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
        while chunk := response.read(1 << 20):
            out.write(chunk)


def _reason(e: OSError) -> str:
    return str(getattr(e, "reason", None) or e).splitlines()[0]


# ---- from pairs to a Corpus ----------------------------------------------------------------------


def _hash(parts: Iterable[object]) -> str:
    return hashlib.sha256(json.dumps(list(parts), default=str).encode()).hexdigest()[:32]


def _clean(pairs: Iterable[tuple[str, str]], lowercase: bool) -> Iterator[tuple[str, str] | None]:
    """The pairs, lower-cased if asked; ``None`` in place of a pair with an empty or blank side."""
    for s, t in pairs:
        if not s.strip() or not t.strip():
            yield None
        else:
            yield (s.lower(), t.lower()) if lowercase else (s, t)


def _collect(pairs: Iterator[tuple[str, str]], cfg: DataConfig, split: str, files: list[Path]) -> Corpus:
    """Gather pairs into lists, or into a cached Arrow file when the files are large."""
    name = f"{cfg.format}:{split}"
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = _hash([name, stats, cfg.src_lang, cfg.tgt_lang, cfg.hf_field, cfg.tsv_columns, cfg.lowercase])
    size = sum(f.stat().st_size * (_GZ_RATIO if f.suffix == ".gz" else 1) for f in files)
    if size > ARROW_ABOVE_BYTES:
        return _arrow_corpus(_clean(pairs, cfg.lowercase), name, key)
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


def write_arrow(path: Path, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> None:
    """Stream record batches into an Arrow file (the ``datasets`` format) via a temporary name and a rename."""
    with atomic_file(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def write_json(path: Path, value: dict) -> None:
    """Write a small JSON file atomically (temporary name, then rename)."""
    with atomic_file(path) as f:
        json.dump(value, f)


def open_arrow(path: Path) -> pa.Table:
    """Memory-map an Arrow file written by ``write_arrow``; reading it copies nothing into RAM."""
    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def corpus_cache_dir() -> Path:
    """Where large local corpora are converted to Arrow: ``tfm-corpora`` in the ``datasets`` cache."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "tfm-corpora"


def _string_batch(rows: list[tuple[str, str]], schema: pa.Schema) -> pa.RecordBatch:
    src, tgt = zip(*rows)
    return pa.record_batch([pa.array(src, pa.large_string()), pa.array(tgt, pa.large_string())], schema=schema)


def _arrow_corpus(pairs: Iterator[tuple[str, str] | None], name: str, key: str) -> Corpus:
    """Stream pairs once into a cached Arrow file keyed by the files' identity, then memory-map it."""
    path = corpus_cache_dir() / f"{key}.arrow"
    meta = path.with_suffix(".json")
    if not meta.is_file():
        dropped = 0
        schema = pa.schema([("src", pa.large_string()), ("tgt", pa.large_string())])

        def batches() -> Iterator[pa.RecordBatch]:
            nonlocal dropped
            rows: list[tuple[str, str]] = []
            for pair in pairs:
                if pair is None:
                    dropped += 1
                else:
                    rows.append(pair)
                if len(rows) == _ARROW_ROWS:
                    yield _string_batch(rows, schema)
                    rows = []
            if rows:
                yield _string_batch(rows, schema)

        write_arrow(path, schema, batches())
        write_json(meta, {"name": name, "dropped_empty": dropped})
    table = open_arrow(path)
    dropped = int(json.loads(meta.read_text())["dropped_empty"])
    return Corpus(ArrowColumn(table["src"]), ArrowColumn(table["tgt"]), name, dropped, key)


# ---- Hugging Face datasets -----------------------------------------------------------------------


def _hf(cfg: DataConfig, split: str) -> Corpus:
    """A ``datasets`` corpus: a hub name (``load_dataset``), a local data folder, or a ``save_to_disk`` folder."""
    table, fingerprint = _hf_table(cfg, split)
    names = table.column_names
    src_lang, tgt_lang = cfg.src_lang, cfg.tgt_lang
    if src_lang in names and tgt_lang in names:
        src, tgt = table[src_lang], table[tgt_lang]
    else:
        field = cfg.hf_field or ("translation" if "translation" in names else None)
        kind = table.schema.field(field).type if field in names else None
        if kind is None or not pa.types.is_struct(kind) or {src_lang, tgt_lang} - {f.name for f in kind}:
            raise DataError(
                f"dataset '{cfg.path}' split '{split}' has no '{src_lang}'/'{tgt_lang}' columns "
                f"(columns: {', '.join(names)}); set data.hf_field to the column holding "
                f"{{'{src_lang}': ..., '{tgt_lang}': ...}} or data.src_lang/tgt_lang to column names"
            )
        flat = table.select([field]).flatten()
        src, tgt = flat[f"{field}.{src_lang}"], flat[f"{field}.{tgt_lang}"]
    keep = _nonblank(src) & _nonblank(tgt)
    rows = None if keep.all() else np.flatnonzero(keep)
    key = _hash([fingerprint, split, src_lang, tgt_lang, cfg.hf_field, cfg.lowercase])
    return Corpus(
        ArrowColumn(src, rows, cfg.lowercase),
        ArrowColumn(tgt, rows, cfg.lowercase),
        f"hf:{split}",
        int((~keep).sum()),
        key,
    )


def _hf_table(cfg: DataConfig, split: str) -> tuple[pa.Table, str]:
    """The split's Arrow table (memory-mapped where ``datasets`` keeps it so) and its fingerprint."""
    import datasets

    folder = Path(cfg.path)
    try:
        if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
            ds = datasets.load_from_disk(str(folder))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"dataset '{folder}' has no split '{split}' (splits: {', '.join(ds)}); fix data.*_split")
                ds = ds[split]
            elif split != cfg.train_split:
                raise DataError(f"dataset '{folder}' holds a single split; set data.holdout: [n_valid, n_test]")
        else:
            ds = datasets.load_dataset(cfg.path, cfg.hf_config, split=split)
    except DataError:
        raise
    except Exception as e:  # datasets raises many types (hub, network, split, config); report them alike
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise DataError(
            f"cannot load dataset '{cfg.path}' (config {cfg.hf_config}, split '{split}'): {reason}; "
            "check the name, data.hf_config and the split names, or use local files (data.format: text)"
        ) from None
    return ds.with_format("arrow")[:], getattr(ds, "_fingerprint", "")


def _nonblank(column: pa.ChunkedArray) -> np.ndarray:
    """True where a string has a non-whitespace character (nulls count as blank), chunk by chunk."""
    parts = [
        pc.fill_null(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(c)), 0), False).to_numpy(zero_copy_only=False)
        for c in column.chunks
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
