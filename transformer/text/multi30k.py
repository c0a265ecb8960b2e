"""Multi30k task 1 (German-English image captions): the files, downloaded from the official
repository into the corpus folder when they are missing, so the quickstart needs no setup."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from transformer.config import DataConfig
from transformer.errors import DataError
from transformer.storage.files import atomic_file
from transformer.text.formats import Pairs, find, pair_files, text_pairs

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"


def read_multi30k(cfg: DataConfig, split: str) -> tuple[Pairs, list[Path]]:
    """``data.format: multi30k``: the split's files in TFM_MULTI30K or ``data.path``, fetched if missing."""
    folder = Path(os.environ.get("TFM_MULTI30K") or cfg.path)
    check_folder(folder)
    langs = (cfg.src_lang, cfg.tgt_lang)
    missing = [f"{split}.{lang}.gz" for lang in langs if find(folder, f"{split}.{lang}") is None]
    for i, name in enumerate(missing):
        try:
            _download(f"{MULTI30K_URL}/{name}", folder / name)
        except OSError as e:
            raise DataError(
                f"Multi30k files missing in {folder}: {', '.join(missing[i:])} (download failed: {_reason(e)}); "
                f"put them there from {MULTI30K_URL}/ or set TFM_MULTI30K to a folder that has them"
            ) from None
    src, tgt = pair_files(folder, split, cfg)
    return text_pairs(src, tgt), [src, tgt]


def check_folder(folder: Path) -> None:
    """The folder Multi30k is read from (and missing files downloaded into) exists: a reader never makes one."""
    if not folder.is_dir():
        named = "TFM_MULTI30K" if os.environ.get("TFM_MULTI30K") else "data.path"
        raise DataError(
            f"Multi30k folder {folder} ({named}) does not exist; point {named} at the folder that holds Multi30k, "
            "or create it (missing files are then downloaded into it)"
        )


def _download(url: str, dest: Path) -> None:
    """Fetch ``url`` into ``dest`` through a temporary file, so a failed download leaves nothing behind."""
    with atomic_file(dest, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
        while chunk := response.read(1 << 20):
            out.write(chunk)


def _reason(e: OSError) -> str:
    return str(getattr(e, "reason", None) or e).splitlines()[0]
