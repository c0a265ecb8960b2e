"""Checkpoints: self-contained, atomic, and loaded without trusting pickles."""

import errno
import os
import pickle

import pytest
import torch

from tiny import tiny_config
from transformer import checkpoint
from transformer.errors import CheckpointError
from transformer.model import build_model
from transformer.tokenizer import Tokenizer

SENTENCES = ["Ein Mann fährt Fahrrad.", "A man rides a bike.", "Der Hund läuft.", "The dog runs."] * 20


@pytest.fixture()
def parts(tmp_path):
    cfg = tiny_config(tmp_path)
    tok = Tokenizer.train(SENTENCES, vocab_size=cfg.tokenizer.vocab_size)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size, tok.pad_id)
    return cfg, tok, model


def test_round_trip(parts, tmp_path):
    cfg, tok, model = parts
    path = checkpoint.save(tmp_path / "ck", cfg, tok, model, {"step": 7}, {"x": torch.ones(2)})
    loaded = checkpoint.load(path)
    assert loaded.meta["step"] == 7 and loaded.tokenizer.fingerprint() == tok.fingerprint()
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.model.state_dict()[k])
    assert torch.equal(checkpoint.load_trainer_state(path)["x"], torch.ones(2))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".ck")]


def test_failed_save_keeps_previous_checkpoint(parts, tmp_path, monkeypatch):
    cfg, tok, model = parts
    path = checkpoint.save(tmp_path / "best", cfg, tok, model, {"step": 1})

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_model", boom)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, cfg, tok, model, {"step": 2})
    assert checkpoint.load(path).meta["step"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".best")] == []


def test_disk_full_is_reported_with_bytes_needed(parts, tmp_path, monkeypatch):
    cfg, tok, model = parts
    path = checkpoint.save(tmp_path / "best", cfg, tok, model, {"step": 1})

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(CheckpointError, match=r"disk full while saving .* bytes needed"):
        checkpoint.save(path, cfg, tok, model, {"step": 2}, {"x": torch.ones(1)})
    assert checkpoint.load(path).meta["step"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".best")] == []


def test_truncated_weights_refused(parts, tmp_path):
    cfg, tok, model = parts
    path = checkpoint.save(tmp_path / "ck", cfg, tok, model, {})
    w = path / checkpoint.WEIGHTS
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        checkpoint.load(path)


def test_missing_files_listed(parts, tmp_path):
    cfg, tok, model = parts
    path = checkpoint.save(tmp_path / "ck", cfg, tok, model, {})
    (path / checkpoint.WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match="lacks model.safetensors"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError, match="not found"):
        checkpoint.load(tmp_path / "nothing")


def test_swapped_tokenizer_refused(parts, tmp_path):
    cfg, tok, model = parts
    path = checkpoint.save(tmp_path / "ck", cfg, tok, model, {})
    other = Tokenizer.train(SENTENCES + ["Völlig andere Sätze hier."] * 5, vocab_size=cfg.tokenizer.vocab_size)
    other.save(path / checkpoint.TOKENIZER)
    with pytest.raises(CheckpointError, match="does not match the weights"):
        checkpoint.load(path)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_malicious_trainer_state_refused(parts, tmp_path, monkeypatch):
    cfg, tok, model = parts
    monkeypatch.chdir(tmp_path)
    path = checkpoint.save(tmp_path / "ck", cfg, tok, model, {}, {"x": 1})
    with open(path / checkpoint.TRAINER, "wb") as f:
        pickle.dump({"state": _Exploit()}, f)
    with pytest.raises(CheckpointError, match="refused"):
        checkpoint.load_trainer_state(path)
    assert not (tmp_path / "pwned").exists()


def test_newest_prefers_best_of_latest_run(parts, tmp_path):
    cfg, tok, model = parts
    runs = tmp_path / "runs"
    checkpoint.save(runs / "a" / "best", cfg, tok, model, {})
    b = checkpoint.save(runs / "b" / "checkpoints" / "step_5", cfg, tok, model, {})
    assert checkpoint.newest(runs) == b
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        checkpoint.newest(tmp_path / "empty")
