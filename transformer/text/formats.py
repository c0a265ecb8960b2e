"""Local corpus files: line-aligned text pairs, TSV and JSONL, each optionally gzipped.

Each reader returns the pairs as a lazy iterator (a large file is read once, as it is converted)
and the files it reads (their size and age key the corpus cache). Every problem is a
``DataError`` whose one-line message names the file (and line) and the fix.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from itertools import chain, zip_longest
from pathlib import Path

from transformer.config import DataConfig
from transformer.errors import DataError

Pairs = Iterator[tuple[str, str]]


def find(folder: Path, stem: str) -> Path | None:
    """``folder/stem`` or ``folder/stem.gz``, whichever exists; one that is not a regular file is refused, naming
    what it is."""
    for p in (folder / stem, folder / f"{stem}.gz"):
        if p.is_file():
            return p
        if p.exists():
            what = "a folder" if p.is_dir() else "a named pipe (FIFO)" if p.is_fifo() else "not a regular file"
            raise DataError(f"{p} is {what}; tfm reads a corpus from files, more than once: save it as a file there")
    return None


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 text file (gzip if it ends in .gz), without line ends or a leading BOM."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    utf16 = n == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in raw
                    source = "utf-16" if utf16 else "latin1"
                    raise DataError(
                        f"{path}:{n}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                        + ("; it looks like UTF-16" if utf16 else "")
                        + f"; convert the file to UTF-8, e.g. iconv -f {source} -t utf-8"
                    ) from None
                yield (line[1:] if n == 1 and line.startswith("\ufeff") else line).rstrip("\r\n")
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e}); check that the file is complete and readable") from None


def text_pairs(src: Path, tgt: Path) -> Pairs:
    """Line-aligned pairs of two files; different line counts are an error naming both counts."""
    n_src = n_tgt = 0
    for s, t in zip_longest(read_lines(src), read_lines(tgt)):
        n_src += s is not None
        n_tgt += t is not None
        if s is not None and t is not None:
            yield s, t
    if n_src != n_tgt:
        raise DataError(
            f"{src} has {n_src} lines but {tgt} has {n_tgt}; the files must be line-aligned translations of each other"
        )


def _tsv_pairs(path: Path, cfg: DataConfig) -> Pairs:
    """Pairs from tab-separated columns, found by a header row naming the languages, else by
    ``data.tsv_columns`` (so one header-less file serves both directions), else source then target."""
    lines = read_lines(path)
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


def _jsonl_pairs(path: Path, cfg: DataConfig) -> Pairs:
    """Pairs from one JSON object per line, e.g. {"de": ..., "en": ...} (inside cfg.hf_field if set)."""
    where = f" inside '{cfg.hf_field}'" if cfg.hf_field else ""
    for n, line in enumerate(read_lines(path), 1):
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


def pair_files(folder: Path, split: str, cfg: DataConfig) -> tuple[Path, Path]:
    """``{split}.{src_lang}`` and ``{split}.{tgt_lang}`` (``.gz`` allowed); DataError naming any missing."""
    src, tgt = (find(folder, f"{split}.{lang}") for lang in (cfg.src_lang, cfg.tgt_lang))
    if src is None or tgt is None:
        missing = [f"{split}.{lang}[.gz]" for lang, f in ((cfg.src_lang, src), (cfg.tgt_lang, tgt)) if f is None]
        raise DataError(f"missing {', '.join(missing)} in {folder}; put one sentence per line there or fix data.path")
    return src, tgt


def one_file(cfg: DataConfig, split: str, ext: str) -> Path:
    """The file holding ``split``: cfg.path itself (train split only) or ``{path}/{split}.{ext}[.gz]``."""
    p = Path(cfg.path)
    if p.is_file():
        if split != cfg.train_split:
            raise DataError(
                f"{p} is a single file, so it has no '{split}' split; set data.holdout: [n_valid, n_test] "
                f"or point data.path at a folder with {split}.{ext}"
            )
        return p
    found = find(p, f"{split}.{ext}")
    if found is None:
        raise DataError(f"missing {split}.{ext} in {p}; create it or fix data.path")
    return found


def read_text(cfg: DataConfig, split: str) -> tuple[Pairs, list[Path]]:
    """``data.format: text``: ``{split}.{src_lang}`` and ``{split}.{tgt_lang}`` in the folder ``data.path``."""
    src, tgt = pair_files(Path(cfg.path), split, cfg)
    return text_pairs(src, tgt), [src, tgt]


def read_tsv(cfg: DataConfig, split: str) -> tuple[Pairs, list[Path]]:
    """``data.format: tsv``: one tab-separated file per split, or one file cut by ``data.holdout``."""
    path = one_file(cfg, split, "tsv")
    return _tsv_pairs(path, cfg), [path]


def read_jsonl(cfg: DataConfig, split: str) -> tuple[Pairs, list[Path]]:
    """``data.format: jsonl``: one JSON-lines file per split, or one file cut by ``data.holdout``."""
    path = one_file(cfg, split, "jsonl")
    return _jsonl_pairs(path, cfg), [path]
