"""The configs that ship with tfm, as package data: ``tfm train --config base`` finds them from any directory.

Data only: this package imports nothing of tfm, so ``transformer.config`` may import it without a loop.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def shipped() -> dict[str, Path]:
    """The configs that ship with tfm, by name (the file name without ``.yaml``)."""
    return {p.stem: p for p in sorted(FOLDER.glob("*.yaml"), key=lambda p: p.stem)}


def describe(path: Path) -> str:
    """A config file's first comment line, which says what it is for."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""
