"""A tiny, fast configuration on the shipped data/sample corpus, shared by the training-side tests."""

from __future__ import annotations

from pathlib import Path

from transformer import config

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"


def tiny_config(run_dir: Path, **sections) -> config.Config:
    """A model small enough to train a few steps in a second or two on CPU."""
    values = {
        "name": "tiny",
        "run_dir": str(run_dir),
        "device": "cpu",
        "model": {"N": 1, "d_model": 32, "d_ff": 64, "h": 2, "dropout": 0.1, "max_positions": 64},
        "data": {"format": "text", "path": str(SAMPLE), "src_lang": "de", "tgt_lang": "en",
                 "valid_split": "valid", "test_split": "valid", "max_len": 63},
        "tokenizer": {"vocab_size": 400},
        "train": {"batch_tokens": 300, "peak_lr": 1e-3, "warmup": 5, "max_steps": 6, "eval_every": 3,
                  "eval_sentences": 8, "save_every": 3, "log_every": 1, "keep_last": 2},
        "decode": {"beam": 2, "max_len_b": 5},
    }
    for section, changes in sections.items():
        if isinstance(changes, dict):
            values.setdefault(section, {}).update(changes)
        else:
            values[section] = changes
    return config.from_dict(values)
