"""The model card of an exported folder: Hub metadata, the checkpoint's eval scores with signature and command,
and the training config."""

from __future__ import annotations

import dataclasses
import json
import shutil

from transformer import checkpoint
from transformer.export.model_card import model_card


def test_card_names_the_languages_and_says_when_there_is_no_score(tiny_checkpoint):
    card = model_card(checkpoint.load(tiny_checkpoint))
    cfg = checkpoint.read_config(tiny_checkpoint)
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: translation\n")
    assert f"language: [{cfg.data.src_lang}, {cfg.data.tgt_lang}]" in card
    assert "Not scored yet: `tfm eval --checkpoint" in card
    assert (tiny_checkpoint / "config.yaml").read_text(encoding="utf-8").strip() in card


def test_card_carries_each_eval_report_with_its_signature_and_command(tiny_checkpoint, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    (ckpt / "eval").mkdir(exist_ok=True)
    report = {
        "split": "test_2016_flickr",
        "beam": 5,
        "alpha": 3.0,
        "bleu": 40.64,
        "bleu_lc": 42.1,
        "chrf": 61.5,
        "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1",
        "command": f"tfm eval --checkpoint {ckpt}",
    }
    (ckpt / "eval" / "test_2016_flickr.beam5.json").write_text(json.dumps(report), encoding="utf-8")
    (ckpt / "eval" / "broken.json").write_text("{", encoding="utf-8")
    card = model_card(checkpoint.load(ckpt))
    assert f"| test_2016_flickr | 40.64 | 42.10 | 61.50 | 5 | 3.0 | `tfm eval --checkpoint {ckpt}` |" in card
    assert "- `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1`" in card
    assert "Not scored yet" not in card


def test_card_of_a_model_trained_on_lowercased_text_says_to_lowercase_the_input(tiny_checkpoint):
    loaded = checkpoint.load(tiny_checkpoint)
    assert "lowercase each sentence" not in model_card(loaded)
    lowercased = dataclasses.replace(loaded.cfg, data=dataclasses.replace(loaded.cfg.data, lowercase=True))
    assert "lowercase each sentence before the tokenizer" in model_card(dataclasses.replace(loaded, cfg=lowercased))


def test_a_multilingual_model_s_card_says_how_to_ask_for_a_language_and_where_it_started(tiny_tagged_run, tmp_path):
    loaded = checkpoint.load(tiny_tagged_run.run_dir / "best")
    card = model_card(loaded)
    assert "language: [de, en]" in card and "# tiny: de-en, en-de" in card
    assert "`>>de<<`, `>>en<<`" in card and '">>en<< your sentence"' in card
    started = dataclasses.replace(loaded.cfg, train=dataclasses.replace(loaded.cfg.train, init="runs/x/best"))
    started.train.init_fingerprint = "ab" * 32
    assert f"started from `runs/x/best` (weights SHA-256 `{'ab' * 32}`)" in model_card(
        dataclasses.replace(loaded, cfg=started)
    )
