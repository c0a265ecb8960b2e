"""Starting a run from a trained model (train.init, tfm train --init): the weights it was given, a fresh optimizer,
new directions with tags of their own, where it started recorded, and what cannot continue refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from cli_helpers import ENV, one_error_line
from tiny import QUICKSTART, TINY_SETS, run_trainer, tiny_config

from transformer import checkpoint
from transformer.errors import TrainError
from transformer.text.batching import collate, make_batches
from transformer.training import setup
from transformer.training.loss import generator_loss


def _loss(model, data, tokenizer) -> float:
    """The model's label-smoothed loss on the first batch of ``data``'s training pairs (eval mode, no dropout)."""
    idx = make_batches(data, 300, 1, 0, shuffle=False)[0]
    b = collate(data, idx, tokenizer)
    model.eval()
    with torch.no_grad():
        loss, _ = generator_loss(model(b.src, b.tgt_in, logits=False), model.generator.weight, b.tgt_out, 0.1, 0)
    return float(loss)


def test_a_run_starts_from_exactly_the_weights_it_was_given(tiny_run, tmp_path):
    """Its model before any update equals the parent's: the same loss on the same batch; the optimizer starts
    afresh; config.yaml and every checkpoint record the parent's path and the SHA-256 of its weights."""
    parent = tiny_run.run_dir / "best"
    cfg = tiny_config(tmp_path, name="child", train={"init": str(parent), "max_steps": 2})
    placed, device = setup.placed(cfg, False, print)
    placed.out_dir.mkdir(parents=True)
    run = setup.prepare(placed, device, False, False, print)
    loaded = checkpoint.load(parent)
    assert _loss(run.model, run.data.train, run.tokenizer) == _loss(loaded.model, run.data.train, loaded.tokenizer)
    assert run.update.optimizer.state == {} and run.state.step == 0
    fingerprint = hashlib.sha256((parent / checkpoint.WEIGHTS).read_bytes()).hexdigest()
    assert (placed.train.init, placed.train.init_fingerprint) == (str(parent), fingerprint)

    result = run_trainer(tiny_config(tmp_path, name="trained", train={"init": str(parent), "max_steps": 2}))
    saved = yaml.safe_load((result.run_dir / "checkpoints" / "step_2" / "config.yaml").read_text())["train"]
    assert (saved["init"], saved["init_fingerprint"]) == (str(parent), fingerprint)


def test_a_new_target_language_gets_a_tag_and_embedding_rows(tiny_run, tmp_path):
    """A bilingual de->en model started on [de-en, en-de]: both tags appended to its vocabulary, the rows it had
    copied, the tags' rows new; it trains and saves."""
    parent = checkpoint.load(tiny_run.run_dir / "best")
    both = {"data": {"directions": ["de-en", "en-de"]}, "train": {"init": str(parent.path), "max_steps": 1}}
    placed, device = setup.placed(tiny_config(tmp_path, **both), False, print)
    placed.out_dir.mkdir(parents=True)
    run = setup.prepare(placed, device, False, False, print)
    old = parent.tokenizer.vocab_size
    assert run.tokenizer.vocab_size == old + 2 and sorted(run.tokenizer.tags.values()) == [old, old + 1]
    assert torch.equal(run.model.src_embed.weight[:old], parent.model.src_embed.weight)
    assert run.model.src_embed.weight[old:].abs().sum() > 0
    assert run_trainer(tiny_config(tmp_path, name="both", **both)).state.step == 1


def test_a_run_folder_starts_from_its_best_and_says_so(tiny_run, tmp_path):
    said: list[str] = []
    cfg, _ = setup.placed(tiny_config(tmp_path, train={"init": str(tiny_run.run_dir)}), False, said.append)
    assert cfg.train.init == str(tiny_run.run_dir / "best") and any("is a run folder" in m for m in said)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"model": {"d_model": 64}}, "model.d_model is 64 in the config and 32 there"),
        ({"model": {"decoder_layers": 2}}, "1 encoder and 2 decoder layers in the config and 1 and 1 there"),
        ({"tokenizer": {"vocab_size": 500}}, "tokenizer.vocab_size is 500 in the config and 400 there"),
        ({"data": {"lowercase": True}}, "data.lowercase is True in the config and False there"),
    ],
)
def test_a_checkpoint_the_config_cannot_continue_is_refused_naming_the_conflict(tiny_run, tmp_path, change, named):
    cfg = tiny_config(tmp_path, **change)
    cfg.train.init = str(tiny_run.run_dir / "best")
    with pytest.raises(TrainError, match=named):
        setup.placed(cfg, False, print)


def test_depths_spelled_apart_continue_a_checkpoint_of_the_same_depths(tiny_run, tmp_path):
    """encoder_layers and decoder_layers equal to the parent's N are its shape, not a conflict."""
    cfg = tiny_config(tmp_path, model={"encoder_layers": 1, "decoder_layers": 1})
    cfg.train.init = str(tiny_run.run_dir / "best")
    placed, _ = setup.placed(cfg, False, print)
    assert placed.train.init == cfg.train.init


def test_through_the_cli_refusals_are_one_line_and_leave_nothing(tiny_run, tmp_path):
    """--init with --resume, a folder that is no checkpoint, a checkpoint damaged mid-file: one line, exit 2, and
    no run directory left behind."""
    runs = tmp_path / "runs"
    base = ["train", "--config", str(QUICKSTART), *TINY_SETS, f"--set=run_dir={runs}", "--set=train.max_steps=1"]
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_run.run_dir / "best", damaged)
    weights = damaged / checkpoint.WEIGHTS
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cases = [
        (["--init", str(tiny_run.run_dir / "best"), "--resume"], "--resume continues the run"),
        (["--init", str(tmp_path)], "lacks config.yaml"),
        (["--init", str(damaged)], "truncated or corrupt"),
    ]
    for extra, message in cases:
        result = subprocess.run([sys.executable, "-m", "cli", *base, *extra], env=ENV, capture_output=True, text=True)
        assert result.returncode == 2 and message in one_error_line(result.stderr), result.stderr
        assert not (runs / "quickstart").exists()


def test_the_run_log_and_meta_of_a_started_run_name_its_parent(tiny_run, tmp_path):
    result = run_trainer(tiny_config(tmp_path, train={"init": str(tiny_run.run_dir / "best"), "max_steps": 1}))
    meta = json.loads((result.run_dir / "checkpoints" / "step_1" / "meta.json").read_text())
    assert meta["init"]["path"] == str(tiny_run.run_dir / "best") and len(meta["init"]["fingerprint"]) == 64


def test_a_run_started_from_a_model_resumes_with_its_parent_recorded(tiny_run, tmp_path):
    parent = str(tiny_run.run_dir / "best")
    run_trainer(tiny_config(tmp_path, train={"init": parent, "max_steps": 2, "save_every": 1}))
    resumed = run_trainer(tiny_config(tmp_path, train={"max_steps": 3, "save_every": 1}), resume=True)
    saved = yaml.safe_load((resumed.run_dir / "checkpoints" / "step_3" / "config.yaml").read_text())["train"]
    assert saved["init"] == parent and resumed.state.step == 3
