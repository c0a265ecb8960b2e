"""The data a training run reads: its train and valid splits, the tokenizer and the splits as token ids.

A new run trains the tokenizer on the training split and saves it in the run directory; a resumed run
brings the one saved with its checkpoint. Token ids are cached under ``<run_dir>/.cache``, shared by
the runs of one ``run_dir``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from transformer import checkpoint
from transformer.config import Config
from transformer.errors import TrainError
from transformer.storage import manifest
from transformer.text.batching import EncodedCorpus, encode_corpus, padded_sizes
from transformer.text.corpus import Corpus, load_split
from transformer.text.tokenizer import Tokenizer, train_tokenizer
from transformer.training import distributed
from transformer.training.run_dir import write_file


def read_splits(
    cfg: Config, run_dir: Path, tokenizer: Tokenizer | None, log: Callable[[str], None]
) -> tuple[Tokenizer, EncodedCorpus, Corpus, EncodedCorpus]:
    """(tokenizer, encoded train split, valid split, encoded valid split); trains and saves a tokenizer if none."""
    d = cfg.data
    train = load_split(d, d.train_split)
    valid = load_split(d, d.valid_split)
    log(f"data: {len(train):,} training pairs ({train.dropped_empty} empty dropped), {len(valid):,} valid")
    if train.split_record is not None and distributed.is_main():  # data.holdout: which pairs were held out
        write_file(run_dir, "split.json", json.dumps(train.split_record, indent=2) + "\n")
    if tokenizer is None:
        tokenizer = train_tokenizer(cfg.tokenizer, train)
        tokenizer.save(run_dir / checkpoint.TOKENIZER)
        manifest.record(run_dir, checkpoint.TOKENIZER)
        log(f"tokenizer: {tokenizer.vocab_size:,} BPE tokens, saved to {run_dir / checkpoint.TOKENIZER}")
    cache = Path(cfg.run_dir) / ".cache"
    train_enc = encode_corpus(train, tokenizer, d.max_len, cache)
    valid_enc = encode_corpus(valid, tokenizer, d.max_len, cache)
    if train_enc.dropped_long:
        log(f"data: {train_enc.dropped_long:,} training pairs longer than data.max_len={d.max_len} dropped")
    if len(train_enc) == 0:
        raise TrainError(f"no training pairs left after filtering {train.name}; check data.path and data.max_len")
    shortest = int(np.maximum(*padded_sizes(train_enc, cfg.train.pad_multiple)).min())
    if shortest > cfg.train.batch_tokens:  # every pair alone exceeds the budget: no batch, nothing to train
        raise TrainError(
            f"train.batch_tokens={cfg.train.batch_tokens} holds no training pair (the shortest takes {shortest} "
            f"tokens); raise train.batch_tokens to at least {shortest}"
        )
    return tokenizer, train_enc, valid, valid_enc
