"""What static shapes cost in padding, on the CPU: the figures that choose ``train.pad_multiple`` for GPU training.

With ``train.static_shapes`` each batch (cut by ``make_batches`` with lengths rounded up to ``pad_multiple``) gets
empty rows up to ``batch_tokens // max(S, T)``, so its shape depends on its padded (S, T) alone; each distinct
(S, T) is one CUDA graph (and one compiled variant). For each corpus, batch size and pad_multiple (1, 4, 8, 16, 32),
over one shuffled epoch (seed 1, epoch 0): batches, the share of tensor cells that are padding without and with
the static rows, the distinct (S, T) shapes, and how many of the most frequent shapes cover 90% and 99% of the batches.
One epoch's shapes are the whole run's: make_batches sorts by padded length, so a new shuffle moves pairs only among
equal lengths and every epoch cuts the same shapes.

Corpora: Multi30k de-en train with configs/base-gpu.yaml's tokenizer, and a synthetic WMT 2014-shaped corpus
(bench.synthetic_wmt, seed 1) with configs/wmt14-base.yaml's tokenizer (trained on ``--wmt-sample`` pairs) and max_len.

    python -m bench.padding                                  # under a minute on 2 cores; JSON in runs/padding.json
    python -m bench.padding --wmt /tmp/wmt_scale/data --json /tmp/padding.json   # a corpus generated before
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from datetime import date
from pathlib import Path

import numpy as np

from bench.common import DEFAULT_DATA, ROOT, machine, shape_config
from bench.synthetic_wmt import generate
from transformer.config import Config
from transformer.config_file import load
from transformer.text.batching import EncodedCorpus, encode_corpus, make_batches, padded_sizes, padding_fraction
from transformer.text.corpus import load_split
from transformer.text.tokenizer import train_tokenizer

PAD_MULTIPLES = (1, 4, 8, 16, 32)
BATCH_TOKENS = (25_000, 4_096)
SEED, EPOCH = 1, 0
COLUMNS = ("batches", "padding", "static_padding", "shapes", "shapes_90", "shapes_99")


def shapes_covering(counts: Counter[tuple[int, int]], share: float) -> int:
    """How many of the most frequent shapes it takes to cover ``share`` of the batches."""
    covered = np.cumsum(sorted(counts.values(), reverse=True))
    return int(np.searchsorted(covered, np.ceil(share * covered[-1]))) + 1


def measure(data: EncodedCorpus, batch_tokens: int, pad_multiple: int) -> dict[str, float | int]:
    """One shuffled epoch's batches, padding shares (plain and with static rows) and (S, T) shape counts."""
    batches = make_batches(data, batch_tokens, SEED, EPOCH, pad_multiple=pad_multiple)
    src, tgt = padded_sizes(data, pad_multiple)
    shapes = Counter((int(src[b].max()), int(tgt[b].max())) for b in map(np.asarray, batches))
    return {
        "batches": len(batches),
        "padding": round(padding_fraction(data, batches, pad_multiple), 4),
        "static_padding": round(padding_fraction(data, batches, pad_multiple, static_tokens=batch_tokens), 4),
        "shapes": len(shapes),
        "shapes_90": shapes_covering(shapes, 0.9),
        "shapes_99": shapes_covering(shapes, 0.99),
    }


def encoded(cfg: Config, cache: Path) -> EncodedCorpus:
    """The config's training split as token ids, with a tokenizer trained on it as the config says."""
    train = load_split(cfg.data, cfg.data.train_split)
    return encode_corpus(train, train_tokenizer(cfg.tokenizer, train), cfg.data.max_len, cache)


def corpora(data: str, wmt: Path | None, pairs: int, sample: int, out: Path) -> dict[str, EncodedCorpus]:
    """Multi30k de-en train and the synthetic WMT corpus (generated into ``out`` unless ``wmt`` is given), encoded."""
    if wmt is None:
        wmt = out / f"wmt-{pairs}"
        if not (wmt / "README.md").is_file():
            generate(wmt, pairs, SEED)
    os.environ.update({"HF_HOME": str(out / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    wmt_cfg = load(ROOT / "configs" / "wmt14-base.yaml", [f"data.path={wmt}", f"tokenizer.train_sample={sample}"])
    return {
        "multi30k-de-en": encoded(shape_config("base-gpu", data), out / "cache"),
        "synthetic-wmt": encoded(wmt_cfg, out / "cache"),
    }


def run(data: dict[str, EncodedCorpus]) -> list[dict[str, object]]:
    """A row of figures per corpus, batch size and pad_multiple."""
    return [
        {
            "corpus": name,
            "pairs": len(corpus),
            "batch_tokens": tokens,
            "pad_multiple": multiple,
            **measure(corpus, tokens, multiple),
        }
        for name, corpus in data.items()
        for tokens in BATCH_TOKENS
        for multiple in PAD_MULTIPLES
    ]


def table(rows: list[dict[str, object]]) -> str:
    """The rows as aligned text, padding shares in percent."""
    head = ("corpus", "batch_tokens", "pad_multiple", *COLUMNS)
    cells = [[f"{r[k] * 100:.1f}%" if "padding" in k else str(r[k]) for k in head] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [list(head), *cells])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.padding", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=DEFAULT_DATA, help="the Multi30k folder")
    parser.add_argument("--wmt", type=Path, help="a synthetic WMT folder made before (else one is generated)")
    parser.add_argument("--wmt-pairs", type=int, default=200_000, help="training pairs of the generated corpus")
    parser.add_argument("--wmt-sample", type=int, default=100_000, help="pairs the WMT tokenizer trains on")
    parser.add_argument("--out", type=Path, help="working folder (corpus, caches); default a temporary one")
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "padding.json", help="where to write the JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = (args.out or Path(scratch)).resolve()
        rows = run(corpora(args.data, args.wmt, args.wmt_pairs, args.wmt_sample, out))
    print(table(rows))
    summary = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "command": " ".join(["python", "-m", "bench.padding", *sys.argv[1:]]),
        "figures": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
