"""Several translation directions in one model (``data.directions``), as OPUS-MT's multilingual models: each source
starts with its target language's tag (``>>fr<<``), one tokenizer serves every language, and the directions are
drawn together in every epoch.

Every format reads one direction as it reads one pair, with that direction's languages: Multi30k's files of any of
its languages, a TSV's or a JSONL file's columns or keys, a Hugging Face dataset's fields; for ``text`` a folder of
the pair's own (``data.path/de-en/``) when there is one, else ``data.path`` itself (a corpus parallel in every
language). How often each direction is drawn is ``data.temperature``: in proportion to its pairs at 1 (every pair
once an epoch), flatter above (a direction of n pairs weighs n ** (1 / temperature), the epoch as many pairs as the
corpora hold), so that a small corpus is seen more often than its size alone would give.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from transformer.config import DataConfig


def direction_name(src: str, tgt: str) -> str:
    """A direction as configs and logs write it: ``de-en``."""
    return f"{src}-{tgt}"


def direction_data(cfg: DataConfig, src: str, tgt: str) -> DataConfig:
    """The data settings that read the one direction ``src`` -> ``tgt`` of ``cfg``."""
    one = replace(cfg, src_lang=src, tgt_lang=tgt, directions=None)
    own = Path(cfg.path) / direction_name(src, tgt)
    return replace(one, path=str(own)) if cfg.format == "text" and own.is_dir() else one


def drawn(directions: np.ndarray, temperature: float, seed: int, epoch: int) -> np.ndarray | None:
    """The pairs an epoch trains on, given each pair's direction (an index): None for every pair once (temperature
    1, or one direction); else each direction's share of the epoch's pairs in proportion to n ** (1 / temperature),
    its pairs repeated as often as that share holds them whole and the rest drawn without replacement, seeded by
    (seed, epoch) so that a resumed run draws the same."""
    sizes = np.bincount(directions)
    if temperature == 1.0 or len(sizes) == 1:
        return None
    weights = sizes.astype(np.float64) ** (1.0 / temperature)
    shares = np.floor(weights / weights.sum() * sizes.sum()).astype(np.int64)
    rng = np.random.default_rng([seed, epoch, len(sizes)])
    parts = []
    for d, share in enumerate(shares.tolist()):
        own = np.flatnonzero(directions == d)
        whole, rest = divmod(share, len(own)) if len(own) else (0, 0)
        parts += [np.tile(own, whole), np.sort(rng.choice(own, size=rest, replace=False))]
    return np.concatenate(parts)


def counts(directions: np.ndarray, pairs: np.ndarray | None, names: list[str]) -> dict[str, int]:
    """How many pairs of each direction an epoch draws (``pairs``: ``drawn``'s answer)."""
    chosen = directions if pairs is None else directions[pairs]
    return dict(zip(names, np.bincount(chosen, minlength=len(names)).tolist()))
