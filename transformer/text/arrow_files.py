"""Arrow files on disk: written as a stream through a temporary name, read back memory-mapped.

Large local corpora and encoded token ids live in such files, so they are read once and then
paged in by the operating system instead of held in memory as Python objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from transformer.storage.files import atomic_file

ARROW_ROWS = 50_000  # rows per record batch written, and per slice read back
_PAIR_SCHEMA = pa.schema([("src", pa.large_string()), ("tgt", pa.large_string())])


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


def cached_pairs(pairs: Iterator[tuple[str, str] | None], name: str, key: str) -> tuple[pa.Table, int]:
    """The pairs as a memory-mapped ``src``/``tgt`` table cached under ``key``, and how many were ``None``.

    The pairs are streamed into the file only the first time; later calls read the cache.
    """
    path = corpus_cache_dir() / f"{key}.arrow"
    meta = path.with_suffix(".json")
    if not meta.is_file():
        dropped = 0

        def batches() -> Iterator[pa.RecordBatch]:
            nonlocal dropped
            rows: list[tuple[str, str]] = []
            for pair in pairs:
                if pair is None:
                    dropped += 1
                else:
                    rows.append(pair)
                if len(rows) == ARROW_ROWS:
                    yield _string_batch(rows)
                    rows = []
            if rows:
                yield _string_batch(rows)

        write_arrow(path, _PAIR_SCHEMA, batches())
        write_json(meta, {"name": name, "dropped_empty": dropped})
    return open_arrow(path), int(json.loads(meta.read_text())["dropped_empty"])


def _string_batch(rows: list[tuple[str, str]]) -> pa.RecordBatch:
    src, tgt = zip(*rows)
    return pa.record_batch([pa.array(src, pa.large_string()), pa.array(tgt, pa.large_string())], schema=_PAIR_SCHEMA)
