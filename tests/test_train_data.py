"""The data a run reads: what the run directory records about it."""

import json
from pathlib import Path

from corpus_files import tatoeba_config
from tiny import run_trainer

from transformer.text.corpus import load_split


def test_split_is_written_to_the_run_directory(tatoeba: Path, tmp_path: Path) -> None:
    """One update of the shipped en->zh config (shrunk) writes split.json: the split zh->en holds out too."""
    tiny = [
        "model.N=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.h=2",
        "tokenizer.vocab_size=400",
        "train.max_steps=1",
        "train.eval_sentences=2",
        "decode.max_len_b=2",
        f"run_dir={tmp_path}",
    ]
    cfg = tatoeba_config("en-zh", tatoeba, *tiny)
    run_trainer(cfg)
    written = json.loads((cfg.out_dir / "split.json").read_text(encoding="utf-8"))
    assert written == load_split(tatoeba_config("zh-en", tatoeba).data, "test").split_record
