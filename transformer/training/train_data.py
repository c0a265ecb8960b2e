"""The data a training run reads: its train and valid splits of each direction, the tokenizer and the splits as
token ids.

A new run trains the tokenizer on the training split(s) and saves it in the run directory; a resumed run brings
the one saved with its checkpoint, a run started from a model (``train.init``) that model's. Token ids are cached
under ``<run_dir>/.cache``, shared by the runs of one ``run_dir``. Several directions (``data.directions``) are read
one by one (transformer.text.directions), each source tagged with its target language, and trained on together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from transformer import checkpoint
from transformer.config import Config
from transformer.errors import TrainError
from transformer.storage import manifest
from transformer.text.batching import EncodedCorpus, encode_corpus, padded_sizes
from transformer.text.corpus import Corpus, load_split
from transformer.text.directions import direction_data, direction_name
from transformer.text.tokenizer import Tokenizer, train_multilingual, train_tokenizer
from transformer.training import distributed
from transformer.training.run_dir import write_file


@dataclass
class Split:
    """One direction's split: its languages, its pairs and their token ids (its sources tagged in a multilingual
    run)."""

    src_lang: str
    tgt_lang: str
    corpus: Corpus
    encoded: EncodedCorpus

    @property
    def name(self) -> str:
        """The direction, ``de-en``."""
        return direction_name(self.src_lang, self.tgt_lang)


@dataclass
class TrainingData:
    """What a run trains and validates on: the tokenizer, every direction's training pairs as token ids (joined,
    each labelled with its direction, for several) and each direction's valid split."""

    tokenizer: Tokenizer
    train: EncodedCorpus
    valid: list[Split]

    @property
    def names(self) -> list[str]:
        """The directions trained, in the config's order."""
        return [s.name for s in self.valid]


def read_splits(cfg: Config, run_dir: Path, tokenizer: Tokenizer | None, log: Callable[[str], None]) -> TrainingData:
    """Every direction's train and valid split, encoded; trains and saves a tokenizer if none is given."""
    d = cfg.data
    pairs = d.pairs()
    trains, valids = {}, {}
    for src, tgt in pairs:
        one = direction_data(d, src, tgt)
        trains[src, tgt], valids[src, tgt] = load_split(one, one.train_split), load_split(one, one.valid_split)
        train, valid = trains[src, tgt], valids[src, tgt]
        named = f"{direction_name(src, tgt)}: " if d.tagged else ""
        log(f"data: {named}{len(train):,} training pairs ({train.dropped_empty} empty dropped), {len(valid):,} valid")
        if train.split_record is not None and distributed.is_main():  # data.holdout: which pairs were held out
            write_file(run_dir, "split.json", json.dumps(train.split_record, indent=2) + "\n")
    if tokenizer is None:
        tokenizer = (
            train_multilingual(cfg.tokenizer, trains) if d.tagged else train_tokenizer(cfg.tokenizer, trains[pairs[0]])
        )
        tokenizer.save(run_dir / checkpoint.TOKENIZER)
        manifest.record(run_dir, checkpoint.TOKENIZER)
        log(f"tokenizer: {tokenizer.vocab_size:,} BPE tokens, saved to {run_dir / checkpoint.TOKENIZER}")
    cache = Path(cfg.run_dir) / ".cache"
    encoded, valid_splits = [], []
    for src, tgt in pairs:
        prefix = [tokenizer.tags[tgt]] if d.tagged else []
        encoded.append(encode_corpus(trains[src, tgt], tokenizer, d.max_len, cache, prefix))
        valid = encode_corpus(valids[src, tgt], tokenizer, d.max_len, cache, prefix)
        valid_splits.append(Split(src, tgt, valids[src, tgt], valid))
    train_enc = encoded[0] if not d.tagged else EncodedCorpus.joined(encoded)
    if train_enc.dropped_long:
        log(f"data: {train_enc.dropped_long:,} training pairs longer than data.max_len={d.max_len} dropped")
    if len(train_enc) == 0:
        names = ", ".join(c.name for c in trains.values())
        raise TrainError(f"no training pairs left after filtering {names}; check data.path and data.max_len")
    shortest = int(np.maximum(*padded_sizes(train_enc, cfg.train.pad_multiple)).min())
    if shortest > cfg.train.batch_tokens:  # every pair alone exceeds the budget: no batch, nothing to train
        raise TrainError(
            f"train.batch_tokens={cfg.train.batch_tokens} holds no training pair (the shortest takes {shortest} "
            f"tokens); raise train.batch_tokens to at least {shortest}"
        )
    return TrainingData(tokenizer, train_enc, valid_splits)
