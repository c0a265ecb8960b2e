"""DDP on CPU with two Gloo processes: same losses and translations as one process with the same global batch.

Two ranks with ``accumulate: 1`` take two batches per update, as one process with ``accumulate: 2``
does. With dropout off, the only differences are float summation order (per-rank gradients are
all-reduced), so losses agree to a relative 1e-5. The tiny corpus makes 11 batches per epoch: the
epoch's last update has one batch, so rank 1 runs a zero-weight filler there and training goes on
into the next epoch without a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import last_step, run_of, train
from events import INSTALLED, assert_events_match_log
from tiny import ROOT, run_trainer, tiny_config

from transformer import checkpoint, config_file
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.text.batching import collate, encode_corpus, make_batches
from transformer.text.corpus import load_split
from transformer.text.tokenizer import train_tokenizer
from transformer.training import distributed
from transformer.training.tensorboard_log import FOLDER

STEPS = 8  # 6 updates per epoch at batch_tokens 1000: crosses the uneven end of epoch 0
TRAIN = {"batch_tokens": 1000, "max_steps": STEPS, "eval_every": 4, "save_every": 4, "keep_last": 3}


def _losses(run_dir: Path, key: str = "loss") -> list[float]:
    entries = map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
    return [e[key] for e in entries if key in e]


def _torchrun(args: list[str], launcher: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, *launcher, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _config_file(tmp_path: Path, name: str, dropout: float = 0.0) -> Path:
    cfg = tiny_config(tmp_path / "runs", name=name, model={"dropout": dropout}, train=TRAIN)
    path = tmp_path / f"{name}.yaml"
    path.write_text(config_file.dump(cfg))
    return path


def _translate(ckpt: Path, lines: list[str]) -> list[str]:
    translator = Translator.from_checkpoint(ckpt, TranslateOptions("cpu", beam=1))
    return [t.best for t in translator.translate(lines)]


def test_shard_gives_every_rank_the_same_count():
    micro = [[0, 1], [2], [3, 4], [5]]
    assert distributed.shard(micro, 2, 0) == [([0, 1], 1.0), ([3, 4], 1.0)]
    assert distributed.shard(micro, 2, 1) == [([2], 1.0), ([5], 1.0)]
    uneven = [[7, 8], [9], [10]]
    counts = {len(distributed.shard(uneven, 4, r)) for r in range(4)}
    assert counts == {1}
    assert distributed.shard(uneven, 4, 3) == [([7, 8], 0.0)]  # filler: joins the all-reduce, adds nothing
    assert sum(w for r in range(4) for _, w in distributed.shard(uneven, 4, r)) == 3


def test_global_token_count_matches_collate(tmp_path):
    cfg = tiny_config(tmp_path)
    train = load_split(cfg.data, "train")
    tok = train_tokenizer(cfg.tokenizer, train)
    enc = encode_corpus(train, tok, cfg.data.max_len, tmp_path / "cache")
    micro = make_batches(enc, 300, 1, 0)[:3]
    assert distributed.target_tokens(enc.tgt_lengths, micro) == sum(collate(enc, i, tok).n_tokens for i in micro)


def test_two_gloo_ranks_match_one_process_and_resume(tmp_path):
    """torchrun 4 steps, then `tfm train --nproc 2 --resume` to 8 == one process, accumulate 2, 8 steps."""
    single = tiny_config(tmp_path / "runs", name="single", model={"dropout": 0.0}, train={**TRAIN, "accumulate": 2})
    run_trainer(single)

    cfg_file = _config_file(tmp_path, "ddp")
    _torchrun(
        ["train", f"--config={cfg_file}", "--quiet", "--set=train.max_steps=4"],
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "cli"],
    )
    _torchrun(["train", "--nproc=2", f"--config={cfg_file}", "--quiet", "--resume"], ["-m", "cli"])

    ddp_run, single_run = tmp_path / "runs" / "ddp", single.out_dir
    assert len(_losses(ddp_run)) == STEPS
    np.testing.assert_allclose(_losses(ddp_run), _losses(single_run), rtol=1e-5)
    np.testing.assert_allclose(_losses(ddp_run, "valid_loss"), _losses(single_run, "valid_loss"), rtol=1e-5)
    if INSTALLED:  # rank 0 alone wrote events: one file per start, each step once
        assert len(list((ddp_run / FOLDER).iterdir())) == 2
        assert_events_match_log(ddp_run)
    sentences = list(load_split(single.data, "valid").src[:16])
    final = f"{checkpoint.STEP_PREFIX}{STEPS}"
    assert _translate(ddp_run / "checkpoints" / final, sentences) == _translate(
        single_run / "checkpoints" / final, sentences
    )


@pytest.mark.slow
def test_distributed_resume_is_exact_with_dropout(tmp_path):
    """Each rank's dropout stream is saved and restored: 4 + 4 steps == 8 steps, bit for bit."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "cli"]
    whole, halves = _config_file(tmp_path, "whole", 0.1), _config_file(tmp_path, "halves", 0.1)
    _torchrun(["train", f"--config={whole}", "--quiet"], launcher)
    _torchrun(["train", f"--config={halves}", "--quiet", "--set=train.max_steps=4"], launcher)
    _torchrun(["train", f"--config={halves}", "--quiet", "--resume"], launcher)
    assert _losses(tmp_path / "runs" / "whole") == _losses(tmp_path / "runs" / "halves")


def test_a_signal_to_the_launcher_is_one_line_and_its_exit_code(monkeypatch, capsys):
    """torchrun raises the SIGTERM it passed on to the workers once they have stopped: tfm says so in one line and
    exits 143, as it does without --nproc."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def stopped(args):
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(torchrun, "run", stopped)
    assert distributed.launch(2, ["train"]) == 143
    assert (
        capsys.readouterr().err == "stopped by SIGTERM: the run keeps its last checkpoint; continue it with --resume\n"
    )


@pytest.mark.slow
def test_sigterm_to_tfm_train_nproc_2_saves_and_exits_143(tmp_path):
    proc = train(tmp_path, "--nproc=2", "--set=device=cpu")
    run = run_of(tmp_path)
    proc.wait_for(lambda: last_step(run) >= 2, "two updates", timeout=300)
    proc.p.send_signal(signal.SIGTERM)
    assert proc.finish(300) == 143, proc.stderr
    assert "Traceback" not in proc.stderr and "stopped by SIGTERM" in proc.stderr
    assert checkpoint.step_dirs(run)
