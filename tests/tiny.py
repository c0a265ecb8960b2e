"""A tiny, fast configuration on the shipped data/sample corpus, shared by the training-side tests.

``tiny_config`` is the config, ``TINY_SETS`` the same model as ``--set`` overrides of the quickstart
config for the command line, ``run_trainer`` trains a config quietly in this process, and
``assert_resumable`` checks a step checkpoint it left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from transformer import checkpoint, config, config_file
from transformer.training.trainer import Result, Trainer

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"

# The quickstart config shrunk to tiny_config's model, for `tfm train`; it runs until stopped (a signal or a limit).
TINY_SETS = [
    f"--set={kv}"
    for kv in (
        "model.N=1",
        "model.d_model=32",
        "model.h=2",
        "model.d_ff=64",
        "tokenizer.vocab_size=400",
        "device=cpu",
        f"data.path={SAMPLE}",
        "train.max_steps=100000",
        "train.batch_tokens=300",
        "train.log_every=1",
        "train.eval_every=100000",
        "train.eval_sentences=4",
        "train.save_every=100000",
        "decode.max_len_b=5",
    )
]


def tiny_config(run_dir: Path, **sections) -> config.Config:
    """A 1-layer model of width 32 on data/sample: 6 updates, validated and saved every 3."""
    values = {
        "name": "tiny",
        "run_dir": str(run_dir),
        "device": "cpu",
        "model": {"N": 1, "d_model": 32, "d_ff": 64, "h": 2, "dropout": 0.1, "max_positions": 64},
        "data": {
            "format": "text",
            "path": str(SAMPLE),
            "src_lang": "de",
            "tgt_lang": "en",
            "valid_split": "valid",
            "test_split": "valid",
            "max_len": 63,
        },
        "tokenizer": {"vocab_size": 400},
        "train": {
            "batch_tokens": 300,
            "peak_lr": 1e-3,
            "warmup": 5,
            "max_steps": 6,
            "eval_every": 3,
            "eval_sentences": 8,
            "save_every": 3,
            "log_every": 1,
            "keep_last": 2,
        },
        "decode": {"beam": 2, "max_len_b": 5},
    }
    for section, changes in sections.items():
        if isinstance(changes, dict):
            values.setdefault(section, {}).update(changes)
        else:
            values[section] = changes
    return config_file.from_dict(values)


def run_trainer(
    cfg: config.Config, resume: bool = False, overwrite: bool = False, log: Callable[[str], None] | None = None
) -> Result:
    """Train ``cfg`` in this process without a progress bar; its messages go to ``log`` (dropped without one)."""
    return Trainer(cfg, resume=resume, overwrite=overwrite, quiet=True, log=log or (lambda msg: None)).run()


def step_of(path: Path) -> int:
    """The step of a ``step_N`` checkpoint directory."""
    return int(path.name[len(checkpoint.STEP_PREFIX) :])


def assert_resumable(path: Path, step: int) -> None:
    """A complete checkpoint: weights load and the trainer state says ``step``."""
    checkpoint.load(path)
    assert checkpoint.load_trainer_state(path)["state"]["step"] == step
