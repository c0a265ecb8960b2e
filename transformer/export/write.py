"""``tfm export``: a checkpoint written as a folder another inference engine loads: CTranslate2
(export.ctranslate2_spec) or Hugging Face transformers' MarianMTModel (export.marian)."""

from __future__ import annotations

from pathlib import Path

from transformer.checkpoint import load
from transformer.errors import ExportError
from transformer.export.ctranslate2_spec import ctranslate2_spec
from transformer.files import atomic_dir

FORMATS = ("ctranslate2", "hf")


def export(checkpoint: str | Path, output: str | Path, fmt: str = "ctranslate2", overwrite: bool = False) -> Path:
    """Write the checkpoint in ``fmt`` to ``output`` (written aside, then renamed into place)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format '{fmt}'; choose one of {', '.join(FORMATS)}")
    out = Path(output)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists; pass --overwrite or choose another --output")
    loaded = load(checkpoint, "cpu")
    if fmt == "hf":
        from transformer.export.marian import check_exportable, write_hf

        check_exportable(loaded.cfg)
        with atomic_dir(out, ours=()) as tmp:
            write_hf(loaded, tmp)
        return out
    spec = ctranslate2_spec(loaded)
    with atomic_dir(out, ours=()) as tmp:
        spec.save(str(tmp))
    return out
