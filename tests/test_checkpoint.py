"""Checkpoints: self-contained, atomic, and loaded without trusting pickles."""

import errno
import json
import os
import pickle
import zipfile
from dataclasses import replace

import pytest
import torch
from tiny import tiny_config

from transformer import checkpoint
from transformer.errors import CheckpointError
from transformer.model.transformer import Transformer
from transformer.storage import manifest
from transformer.storage.files import clean_partial
from transformer.text.tokenizer import Tokenizer

SENTENCES = ["Ein Mann fährt Fahrrad.", "A man rides a bike.", "Der Hund läuft.", "The dog runs."] * 20


@pytest.fixture()
def parts(tmp_path):
    cfg = tiny_config(tmp_path)
    tok = Tokenizer.train(SENTENCES, vocab_size=cfg.tokenizer.vocab_size)
    torch.manual_seed(0)
    model = Transformer(cfg.model, tok.vocab_size, tok.pad_id)
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


def test_config_written_with_the_retired_top_level_compile_still_reads(parts, tmp_path):
    cfg, tok, model = parts
    path = checkpoint.save(tmp_path / "ck", cfg, tok, model, {"step": 7})
    written = (path / checkpoint.CONFIG).read_text(encoding="utf-8")
    (path / checkpoint.CONFIG).write_text("compile: false\n" + written, encoding="utf-8")
    assert checkpoint.read_config(path) == cfg
    (path / checkpoint.CONFIG).write_text("compile: true\n" + written, encoding="utf-8")
    with pytest.raises(CheckpointError, match="unknown config key 'compile'"):
        checkpoint.read_config(path)


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


@pytest.mark.parametrize("what", ["trainer state", "weights"])
def test_a_real_full_disk_is_one_error_and_the_last_checkpoint_survives(parts, small_disk, what):
    """safetensors and torch.save fail with errors of their own on a full disk; both become CheckpointError."""
    cfg, tok, model = parts
    path = checkpoint.save(small_disk / "best", cfg, tok, model, {"step": 1})
    if what == "weights":
        bigger = Transformer(replace(cfg.model, d_model=256, d_ff=512), tok.vocab_size, tok.pad_id)
        args = (cfg, tok, bigger, {"step": 2})
    else:
        args = (cfg, tok, model, {"step": 2}, {"x": torch.ones(10**6)})
    with pytest.raises(CheckpointError, match=r"disk full while saving .* bytes needed, .* free"):
        checkpoint.save(path, *args)
    assert checkpoint.load(path).meta["step"] == 1
    assert [p.name for p in small_disk.iterdir()] == ["best"]


def test_non_finite_weights_refused_naming_the_tensor(parts, tmp_path):
    cfg, tok, model = parts
    with torch.no_grad():
        model.decoder.layers[0].ff.w_1.weight[0, 0] = float("nan")
    path = checkpoint.save(tmp_path / "ck", cfg, tok, model, {})
    with pytest.raises(CheckpointError, match=r"holds non-finite values \(NaN or inf\) in decoder.layers.0.ff.w_1"):
        checkpoint.load(path)


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


def test_prune_never_leaves_a_half_deleted_checkpoint_that_looks_complete(parts, tmp_path, monkeypatch):
    cfg, tok, model = parts
    for step in (1, 2, 3):
        checkpoint.save(tmp_path / "checkpoints" / f"step_{step}", cfg, tok, model, {"step": step})

    def killed(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(manifest, "delete", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(tmp_path, keep_last=2)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.step_dirs(tmp_path)] == ["step_2", "step_3"]
    assert clean_partial(tmp_path / "checkpoints") == [f"removed .step_1.tmp-{os.getpid()}"]


def test_checkpoint_saved_on_another_device_loads_on_cpu(tiny_checkpoint, tmp_path, monkeypatch):
    """safetensors records dtype, shape and offsets only; trainer.pt tensors tagged 'cuda:0' load via map_location."""
    header_len = int.from_bytes((tiny_checkpoint / checkpoint.WEIGHTS).read_bytes()[:8], "little")
    header = json.loads((tiny_checkpoint / checkpoint.WEIGHTS).read_bytes()[8 : 8 + header_len])
    assert {k for name, v in header.items() if name != "__metadata__" for k in v} == {"dtype", "shape", "data_offsets"}

    # Write trainer.pt as a GPU run would: every storage tagged 'cuda:0' (this machine need not have one).
    gpu_copy = tmp_path / "gpu"
    loaded = checkpoint.load(tiny_checkpoint)
    checkpoint.save(gpu_copy, loaded.cfg, loaded.tokenizer, loaded.model, loaded.meta)
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    torch.save({"state": {"step": 3}, "exp_avg": torch.ones(3)}, gpu_copy / checkpoint.TRAINER)
    monkeypatch.undo()
    with zipfile.ZipFile(gpu_copy / checkpoint.TRAINER) as z:
        assert b"cuda:0" in z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    if not torch.cuda.is_available():  # a plain torch.load would fail here, as users of other toolkits report
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(gpu_copy / checkpoint.TRAINER, weights_only=True)
    state = checkpoint.load_trainer_state(gpu_copy)
    assert state["exp_avg"].device.type == "cpu" and torch.equal(state["exp_avg"], torch.ones(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to save from")
def test_checkpoint_saved_from_cuda_loads_on_cpu(tiny_checkpoint, tmp_path):
    loaded = checkpoint.load(tiny_checkpoint, "cuda")
    path = checkpoint.save(
        tmp_path / "gpu",
        loaded.cfg,
        loaded.tokenizer,
        loaded.model,
        loaded.meta,
        {"exp_avg": torch.ones(3, device="cuda")},
    )
    back = checkpoint.load(path, "cpu")
    assert all(p.device.type == "cpu" for p in back.model.parameters())
    assert checkpoint.load_trainer_state(path)["exp_avg"].device.type == "cpu"
