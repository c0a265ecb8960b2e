"""The data a training run reads: its train and valid splits of each direction, the tokenizer and the splits as
token ids.

A new run trains the tokenizer on the training split(s) and saves it in the run directory; a resumed run brings
the one saved with its checkpoint, a run started from a model (``train.init``) that model's. Token ids are cached
under ``<run_dir>/.cache``, shared by the runs of one ``run_dir``. Several directions (``data.directions``) are read
one by one (transformer.text.directions), each source tagged with its target language, and trained on together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
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
    """What a run trains and validates on: the tokenizer, the training pairs as token ids (for several directions,
    or synthetic pairs beside real ones, the parts joined, each pair labelled with its part, named in ``parts``) and
    each direction's valid split."""

    tokenizer: Tokenizer
    train: EncodedCorpus
    valid: list[Split]
    parts: list[str]


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
    synthetic = _synthetic(cfg, log)
    if tokenizer is None and cfg.tokenizer.path is not None:  # taken as it is (a distillation student's teacher's)
        tokenizer = Tokenizer.load(cfg.tokenizer.path)
        tokenizer = tokenizer.with_tags(t for _, t in pairs) if d.tagged else tokenizer
        tokenizer = tokenizer.with_specials([Tokenizer.BT] if synthetic is not None and d.synthetic_tag else [])
        tokenizer.save(run_dir / checkpoint.TOKENIZER)
        manifest.record(run_dir, checkpoint.TOKENIZER)
        log(f"tokenizer: {tokenizer.vocab_size:,} BPE tokens, taken from {cfg.tokenizer.path}")
    if tokenizer is None:
        tokenizer = (
            train_multilingual(cfg.tokenizer, trains) if d.tagged else train_tokenizer(cfg.tokenizer, trains[pairs[0]])
        )
        tokenizer = tokenizer.with_specials([Tokenizer.BT] if synthetic is not None and d.synthetic_tag else [])
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
    parts = [s.name for s in valid_splits]
    if synthetic is not None:
        if d.synthetic_tag and tokenizer.bt_id is None:
            raise TrainError(
                f"data.synthetic_tag: the run's tokenizer has no {Tokenizer.BT} token (it was made without synthetic "
                "pairs); set data.synthetic_tag: false or start a new run"
            )
        prefix = [tokenizer.bt_id] if d.synthetic_tag and tokenizer.bt_id is not None else []
        encoded.append(encode_corpus(synthetic, tokenizer, d.max_len, cache, prefix))
        parts.append(f"{parts[0]} synthetic")
    train_enc = encoded[0] if len(encoded) == 1 else EncodedCorpus.joined(encoded)
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
    return TrainingData(tokenizer, train_enc, valid_splits, parts)


def _synthetic(cfg: Config, log: Callable[[str], None]) -> Corpus | None:
    """The synthetic pairs ``data.synthetic`` holds, read as a ``text`` corpus of the run's languages; None without."""
    d = cfg.data
    if d.synthetic is None:
        return None
    corpus = load_split(replace(d, format="text", path=d.synthetic, holdout=None), d.train_split)
    tagged = f", their sources tagged {Tokenizer.BT}" if d.synthetic_tag else ""
    log(f"data: {len(corpus):,} synthetic pairs from {d.synthetic} ({corpus.dropped_empty} empty dropped){tagged}")
    return corpus
