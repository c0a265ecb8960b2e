"""Helpers for the data-side tests: corpus files written into a test's folder, a corpus's pairs,
one-line errors, the shipped Tatoeba configs pointed at a corpus file, and Chinese test sentences."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from tiny import ROOT

from transformer import config, config_file
from transformer.text.corpus import Corpus

TRADITIONAL_EMOJI = ["我們明天去公園。", "我们明天去公园。🌳😀", "👨‍👩‍👧 喜歡 🍜！", "𠀀𪚥𠮷"]
PAIRS = [("Ein Mann fährt Fahrrad.", "A man rides a bike."), ("Der Hund läuft.", "The dog runs."), ("Grün.", "Green.")]


def write_lines(path: Path, lines: list[str]) -> Path:
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def text_dir(tmp_path: Path, pairs: list[tuple[str, str]] = PAIRS, split: str = "train", ext: str = "") -> Path:
    write_lines(tmp_path / f"{split}.de{ext}", [p[0] for p in pairs])
    write_lines(tmp_path / f"{split}.en{ext}", [p[1] for p in pairs])
    return tmp_path


def as_pairs(c: Corpus) -> list[tuple[str, str]]:
    return list(zip(c.src, c.tgt))


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def tatoeba_config(direction: str, path: Path, *overrides: str) -> config.Config:
    """configs/tatoeba-<direction>.yaml reading the corpus at ``path``."""
    return config_file.load(ROOT / "configs" / f"tatoeba-{direction}.yaml", [f"data.path={path}", *overrides])


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a CJK ideograph (basic, extension A, compatibility or a supplementary plane)."""
    return any("\u3400" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff" or ch >= "\U00020000" for ch in text)
