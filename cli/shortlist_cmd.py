"""``tfm shortlist``: count a lexical shortlist (decoding.shortlist) for a checkpoint from parallel text, its
training split's by default."""

from __future__ import annotations

import dataclasses
import sys
from itertools import islice
from pathlib import Path

from cli.exits import fail
from cli.guards import check_data_dir, check_output, read_pairs


def run_shortlist(
    checkpoint: Path,
    output: Path,
    src: Path | None,
    tgt: Path | None,
    data_dir: str | None,
    per_token: int,
    frequent: int,
    max_pairs: int,
    overwrite: bool,
) -> None:
    """Tokenize up to ``max_pairs`` pairs with the checkpoint's tokenizer, count the shortlist and write it."""
    from transformer import checkpoint as ckpt
    from transformer.decoding.shortlist import Shortlist
    from transformer.text.corpus import load_split
    from transformer.text.directions import direction_data
    from transformer.text.tokenizer import Tokenizer

    if (src is None) != (tgt is None):
        fail("--src and --tgt go together; give both, or neither to count the checkpoint's training split")
    given = read_pairs(src, tgt) if src is not None and tgt is not None else None
    ckpt.check_files(checkpoint, ckpt.CONFIG, ckpt.TOKENIZER)
    check_output(output, overwrite, (src, tgt, *ckpt.read_files(checkpoint)))
    cfg = ckpt.read_config(checkpoint)
    tokenizer = Tokenizer.load(checkpoint / ckpt.TOKENIZER)
    if given is not None:  # as the training data was read: lowercased for a model trained on lowercased text
        texts = [(s.lower(), t.lower()) if cfg.data.lowercase else (s, t) for s, t in islice(zip(*given), max_pairs)]
    else:  # load_split lowercases as the config says
        check_data_dir(data_dir, cfg.data.format)
        data = dataclasses.replace(cfg.data, path=data_dir) if data_dir else cfg.data
        texts = []
        for s, t in data.pairs():
            corpus = load_split(direction_data(data, s, t), data.train_split)
            texts += list(islice(zip(corpus.src, corpus.tgt), max_pairs - len(texts)))
    ids = zip(tokenizer.encode_batch([s for s, _ in texts]), tokenizer.encode_batch([t for _, t in texts]))
    shortlist = Shortlist.count(ids, tokenizer, per_token, frequent)
    shortlist.save(output)
    print(
        f"shortlist of {len(texts):,} pairs: {per_token} target tokens per source token, {len(shortlist.always):,} "
        f"kept for every sentence, written to {output}",
        file=sys.stderr,
    )
