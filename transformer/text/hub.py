"""Hugging Face ``datasets`` corpora: a hub name (``load_dataset``), a local data folder, or a
``save_to_disk`` folder. The columns stay in the Arrow files ``datasets`` keeps (memory-mapped),
so a WMT-sized corpus never becomes Python strings."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from transformer.config import DataConfig
from transformer.errors import DataError


def read_hub(cfg: DataConfig, split: str) -> tuple[pa.ChunkedArray, pa.ChunkedArray, str]:
    """The split's source and target columns and the dataset's fingerprint.

    The languages are columns of their own, or fields of a struct column (``data.hf_field``, or
    ``translation`` as the hub's translation datasets have it).
    """
    table, fingerprint = _table(cfg, split)
    names = table.column_names
    src_lang, tgt_lang = cfg.src_lang, cfg.tgt_lang
    if src_lang in names and tgt_lang in names:
        return table[src_lang], table[tgt_lang], fingerprint
    field = cfg.hf_field or ("translation" if "translation" in names else None)
    kind = table.schema.field(field).type if field in names else None
    if kind is None or not pa.types.is_struct(kind) or {src_lang, tgt_lang} - {f.name for f in kind}:
        raise DataError(
            f"dataset '{cfg.path}' split '{split}' has no '{src_lang}'/'{tgt_lang}' columns "
            f"(columns: {', '.join(names)}); set data.hf_field to the column holding "
            f"{{'{src_lang}': ..., '{tgt_lang}': ...}} or data.src_lang/tgt_lang to column names"
        )
    flat = table.select([field]).flatten()
    return flat[f"{field}.{src_lang}"], flat[f"{field}.{tgt_lang}"], fingerprint


def _table(cfg: DataConfig, split: str) -> tuple[pa.Table, str]:
    """The split's Arrow table (memory-mapped where ``datasets`` keeps it so) and its fingerprint."""
    import datasets

    folder = Path(cfg.path)
    try:
        if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
            ds = datasets.load_from_disk(str(folder))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(
                        f"dataset '{folder}' has no split '{split}' (splits: {', '.join(ds)}); fix data.*_split"
                    )
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
