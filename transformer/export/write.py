"""``tfm export``: a checkpoint written as a folder another inference engine loads: CTranslate2
(export.ctranslate2_spec) or Hugging Face transformers' MarianMTModel (export.marian)."""

from __future__ import annotations

import os
from pathlib import Path

from transformer.checkpoint import load, read_files
from transformer.errors import ExportError
from transformer.export.ctranslate2_spec import ctranslate2_spec
from transformer.storage.files import atomic_dir, check_apart, check_replaceable, output_path

FORMATS = ("ctranslate2", "hf")
KIND = "export"  # what an export folder is recorded as (storage.manifest): --overwrite replaces only one of these


def export(checkpoint: str | Path, output: str | Path, fmt: str = "ctranslate2", overwrite: bool = False) -> Path:
    """Write the checkpoint in ``fmt`` to ``output`` (written aside, then renamed into place); an existing ``output``
    is replaced (``overwrite``) only when it is an earlier export that holds nothing else."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format '{fmt}'; choose one of {', '.join(FORMATS)}")
    out = Path(output)
    check_apart(out, read_files(Path(checkpoint)), folder=True)
    check_replaceable(output_path(out), KIND)
    if os.path.lexists(out) and not overwrite:
        raise ExportError(f"{out} already exists; pass --overwrite or choose another --output")
    loaded = load(checkpoint, "cpu")
    if fmt == "hf":
        from transformer.export.marian import check_exportable, write_hf

        check_exportable(loaded.cfg)
        with atomic_dir(out, KIND) as tmp:
            write_hf(loaded, tmp)
        return out
    spec = ctranslate2_spec(loaded)
    with atomic_dir(out, KIND) as tmp:
        spec.save(str(tmp))
    return out
