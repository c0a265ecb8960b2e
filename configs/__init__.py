"""The configs that ship with tfm, as package data: ``tfm train --config base`` finds them from any directory."""

from __future__ import annotations

from pathlib import Path

from transformer.errors import ConfigError

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


def find(name: str | Path) -> Path:
    """The config file ``name``: a path that exists, else a shipped config (``base`` or ``base.yaml``)."""
    p = Path(name)
    if p.is_file():
        return p
    configs = shipped()
    if p.parent == Path(".") and p.suffix in ("", ".yaml", ".yml") and p.stem in configs:
        return configs[p.stem]
    raise ConfigError(f"config file '{p}' not found; give a YAML file or a shipped config: "
                      f"{', '.join(configs)} (tfm configs says what each is for)")
