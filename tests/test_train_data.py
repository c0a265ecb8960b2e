"""The data a run reads: its directions, tokenizer and tagged sources, and what the run directory records."""

import json
from pathlib import Path

import numpy as np
from corpus_files import tatoeba_config
from tiny import run_trainer, tiny_config

from transformer.text.corpus import load_split
from transformer.training.train_data import read_splits


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


def test_one_pair_reads_as_it_always_did_untagged(tmp_path: Path) -> None:
    """Without data.directions: no tags in the tokenizer, sources as the tokenizer encodes them."""
    cfg = tiny_config(tmp_path)
    cfg.out_dir.mkdir(parents=True)
    data = read_splits(cfg, cfg.out_dir, None, lambda msg: None)
    assert data.tokenizer.tags == {} and data.parts == ["de-en"] and data.train.directions is None
    corpus = data.valid[0].corpus
    src, _ = data.valid[0].encoded.pair(0)
    assert src == data.tokenizer.encode(corpus.src[int(data.valid[0].encoded.rows[0])])


def test_several_directions_share_one_tokenizer_and_tag_each_source(tmp_path: Path) -> None:
    """de-en and en-de on the sample corpus: one tokenizer with both tags; every source starts with its target's tag;
    the training pairs of both, each labelled with its direction."""
    cfg = tiny_config(tmp_path, data={"directions": ["de-en", "en-de"]})
    cfg.out_dir.mkdir(parents=True)
    said: list[str] = []
    data = read_splits(cfg, cfg.out_dir, None, said.append)
    tok = data.tokenizer
    assert set(tok.tags) == {"de", "en"} and data.parts == ["de-en", "en-de"]
    assert any(m.startswith("data: de-en: ") for m in said) and any(m.startswith("data: en-de: ") for m in said)
    assert sorted(np.bincount(data.train.directions).tolist()) == [len(data.train) // 2] * 2
    for i in (0, len(data.train) - 1):
        src, _ = data.train.pair(i)
        target = "en" if data.train.directions[i] == 0 else "de"
        assert src[0] == tok.tags[target] and tok.tags[target] not in src[1:]
    de_en, en_de = data.valid
    assert de_en.corpus.src[0] == en_de.corpus.tgt[0]  # the same sample pairs, each way


def test_synthetic_pairs_train_beside_the_real_ones_their_sources_tagged(tmp_path: Path) -> None:
    """data.synthetic: a folder of back-translated pairs joins the training split (not valid), each source after
    <BT>; the tokenizer gains <BT>; untagged with data.synthetic_tag: false."""
    bt = tmp_path / "bt"
    bt.mkdir()
    (bt / "train.de").write_text("Ein Hund läuft.\nZwei Katzen.\n", encoding="utf-8")
    (bt / "train.en").write_text("A dog runs.\nTwo cats.\n", encoding="utf-8")
    for tagged in (True, False):
        cfg = tiny_config(tmp_path / str(tagged), data={"synthetic": str(bt), "synthetic_tag": tagged})
        cfg.out_dir.mkdir(parents=True)
        said: list[str] = []
        data = read_splits(cfg, cfg.out_dir, None, said.append)
        assert data.parts == ["de-en", "de-en synthetic"] and np.bincount(data.train.directions)[1] == 2
        assert any("2 synthetic pairs from" in m for m in said)
        src, tgt = data.train.pair(len(data.train) - 1)
        tok = data.tokenizer
        want = ([tok.bt_id] if tagged else []) + tok.encode("Zwei Katzen.")
        assert (src, tgt) == (want, tok.encode("Two cats.")) and (tok.bt_id is not None) == tagged
        assert len(data.valid) == 1 and len(data.valid[0].corpus) == 80
