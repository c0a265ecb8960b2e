"""The training loop: it trains, keeps the best and the last checkpoints, and resumes exactly."""

import json
from pathlib import Path

import pytest
import torch

from corpus_files import tatoeba_config
from tiny import tiny_config
from transformer import checkpoint, train, update, validation
from transformer.corpus import load_split
from transformer.errors import TrainError
from transformer.train import Trainer


def _losses(run_dir):
    lines = (run_dir / "log.jsonl").read_text().splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["kind"] == "train"]


def test_trains_and_writes_run_directory(tmp_path):
    cfg = tiny_config(tmp_path)
    result = Trainer(cfg, quiet=True, log=lambda m: None).run()
    run = cfg.out_dir
    assert result.reason == "max_steps" and result.state.step == 6
    assert (run / "config.yaml").is_file() and (run / "tokenizer.json").is_file()
    assert [p.name for p in checkpoint.step_dirs(run)] == ["step_3", "step_6"]
    assert (run / "best" / "model.safetensors").is_file()
    losses = _losses(run)
    assert len(losses) == 6 and all(l == l for l in losses)
    kinds = [json.loads(l)["kind"] for l in (run / "log.jsonl").read_text().splitlines()]
    assert kinds.count("valid") == 2


def test_loss_goes_down(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 40, "eval_every": 40, "save_every": 40, "peak_lr": 3e-3},
                      model={"dropout": 0.0})
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    losses = _losses(cfg.out_dir)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_exact_resume(tmp_path):
    """2N steps in one go == N steps, stop, resume for N: same losses, same weights (CPU, fp32)."""
    whole = tiny_config(tmp_path / "a", train={"max_steps": 6, "save_every": 3})
    Trainer(whole, quiet=True, log=lambda m: None).run()
    half = tiny_config(tmp_path / "b", train={"max_steps": 3, "save_every": 3})
    Trainer(half, quiet=True, log=lambda m: None).run()
    rest = tiny_config(tmp_path / "b", train={"max_steps": 6, "save_every": 3})
    Trainer(rest, resume=True, quiet=True, log=lambda m: None).run()
    assert _losses(whole.out_dir) == _losses(rest.out_dir)
    a = checkpoint.load(checkpoint.step_dirs(whole.out_dir)[-1]).model.state_dict()
    b = checkpoint.load(checkpoint.step_dirs(rest.out_dir)[-1]).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_changed_architecture(tmp_path):
    Trainer(tiny_config(tmp_path, train={"max_steps": 3}), quiet=True, log=lambda m: None).run()
    changed = tiny_config(tmp_path, model={"d_ff": 128}, train={"max_steps": 6})
    with pytest.raises(TrainError, match=r"model.d_ff \(64 -> 128\)"):
        Trainer(changed, resume=True, quiet=True, log=lambda m: None).run()


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    with pytest.raises(TrainError, match="already exists; pass --resume"):
        Trainer(cfg, quiet=True, log=lambda m: None).run()
    assert Trainer(cfg, overwrite=True, quiet=True, log=lambda m: None).run().state.step == 3


def test_resume_of_finished_run_is_a_no_op(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    messages = []
    result = Trainer(cfg, resume=True, quiet=True, log=messages.append).run()
    assert result.reason == "finished" and any("already at max_steps" in m for m in messages)


def test_resume_skips_a_damaged_newest_checkpoint_and_keeps_it_aside(tmp_path):
    """A truncated newest checkpoint: resume goes on from the one before; the damaged one is kept, renamed."""
    cfg = tiny_config(tmp_path, train={"max_steps": 4, "save_every": 2, "keep_last": 3})
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    older, newest = checkpoint.step_dirs(cfg.out_dir)[-2:]
    weights = newest / checkpoint.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])
    messages = []
    more = tiny_config(tmp_path, train={"max_steps": 6, "save_every": 2, "keep_last": 3})
    assert Trainer(more, resume=True, quiet=True, log=messages.append).run().state.step == 6
    assert f"resumed from {older} at step 2" in messages
    aside = newest.with_name(f"damaged-{newest.name}")
    assert aside.is_dir() and (aside / checkpoint.WEIGHTS).stat().st_size == 100
    assert any("is damaged" in m and str(aside) in m for m in messages)


def test_resume_with_only_damaged_checkpoints_is_a_clear_error(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 2, "save_every": 2})
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    for path in checkpoint.step_dirs(cfg.out_dir):
        (path / checkpoint.TRAINER).write_bytes(b"not a checkpoint")
    with pytest.raises(TrainError, match="every checkpoint in .* is damaged"):
        Trainer(tiny_config(tmp_path, train={"max_steps": 4}), resume=True, quiet=True, log=lambda m: None).run()


def test_auto_precision_trains_as_resolved_and_the_run_config_records_it(tmp_path):
    cfg = tiny_config(tmp_path, precision="auto", train={"max_steps": 1})
    logs = []
    Trainer(cfg, quiet=True, log=logs.append).run()
    assert cfg.precision == "auto" and any(m.endswith("on cpu in fp32") for m in logs)
    assert "precision: fp32" in (cfg.out_dir / "config.yaml").read_text()


def test_training_on_cuda_picks_attention_kernels_per_batch(tmp_path, monkeypatch):
    """Every training and validation forward pass runs without cuDNN attention (it plans every new shape) and,
    its batch being short, without flash; the flags are process-wide, readable without a GPU, and restored."""
    real, build = update.training_attention, train.build_model
    for module in (update, validation):
        monkeypatch.setattr(module, "training_attention", lambda device, length: real(torch.device("cuda"), length))
    cuda, seen = torch.backends.cuda, []

    def watched(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(lambda module, inputs: seen.append(
            (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled())))
        return model

    monkeypatch.setattr(train, "build_model", watched)
    Trainer(tiny_config(tmp_path, train={"max_steps": 2, "eval_every": 2}), quiet=True, log=lambda m: None).run()
    assert len(seen) >= 3 and set(seen) == {(False, False, True)}
    assert cuda.cudnn_sdp_enabled() and cuda.flash_sdp_enabled()


def test_split_is_written_to_the_run_directory(tatoeba: Path, tmp_path: Path) -> None:
    """One update of the shipped en->zh config (shrunk) writes split.json: the split zh->en holds out too."""
    tiny = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "tokenizer.vocab_size=400",
            "train.max_steps=1", "train.eval_sentences=2", "decode.max_len_b=2", f"run_dir={tmp_path}"]
    cfg = tatoeba_config("en-zh", tatoeba, *tiny)
    Trainer(cfg, quiet=True, log=lambda m: None).run()
    written = json.loads((cfg.out_dir / "split.json").read_text(encoding="utf-8"))
    assert written == load_split(tatoeba_config("zh-en", tatoeba).data, "test").split_record
