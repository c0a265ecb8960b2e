"""Checkpoint averaging: the mean of the weights of a run's last K step checkpoints.

The paper averaged the last 5 checkpoints (written every 10 minutes) for its base models and the
last 20 for the big ones. The mean is taken in float64, one checkpoint at a time, and written as
an ordinary checkpoint directory (config, tokenizer, weights, meta; no trainer state), so that
``tfm translate`` and ``tfm eval`` take it like any other. It replaces only an earlier average, never a trained
checkpoint, a folder holding anything else, or what it reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from transformer import checkpoint
from transformer.config_file import to_dict
from transformer.errors import CheckpointError
from transformer.storage.files import check_apart, check_replaceable, output_path

# What makes checkpoints one run's: the same seed, model, data and tokenizer (train settings may change on resume).
_SAME = ("seed", "model", "data", "tokenizer")


def _check_one_run(paths: list[Path]) -> None:
    """Checkpoints whose weights can be averaged: written by one run, so one seed, model, data and tokenizer (their
    configs say so); else one line naming what differs."""
    configs = [to_dict(checkpoint.read_config(p)) for p in paths]
    for path, cfg in zip(paths[:-1], configs[:-1]):
        if differ := [k for k in _SAME if cfg[k] != configs[-1][k]]:
            key = differ[0]
            shown = (cfg[key], configs[-1][key]) if key == "seed" else ("one", "another")
            raise CheckpointError(
                f"{path} and {paths[-1]} come from different runs ({key}: {shown[0]} and {shown[1]}); average only "
                "checkpoints of one run"
            )


def average(run_dir: str | Path, last: int, output: str | Path, overwrite: bool = False) -> Path:
    """Average the newest ``last`` checkpoints of ``run_dir/checkpoints`` into the checkpoint ``output``."""
    run_dir, output = Path(run_dir), Path(output)
    if last < 1:
        raise CheckpointError(f"--last must be at least 1, got {last}")
    dirs = checkpoint.step_dirs(run_dir)
    if not dirs:
        raise CheckpointError(f"no step checkpoints in {run_dir}/checkpoints; pass a run directory such as runs/<name>")
    if len(dirs) < last:
        raise CheckpointError(
            f"{run_dir} keeps only {len(dirs)} step checkpoints ({', '.join(d.name for d in dirs)}); "
            f"use --last {len(dirs)} or train with a larger train.keep_last"
        )
    try:
        where = output.resolve()
    except (RuntimeError, OSError):  # a symlink loop: Python 3.11 raises RuntimeError, later ones OSError
        raise CheckpointError(f"--output '{output}' is a symlink loop; remove it or choose another --output") from None
    if where.is_relative_to((run_dir / "checkpoints").resolve()) or where == run_dir.resolve():
        raise CheckpointError(
            f"--output '{output}' would replace the run or one of its resumable checkpoints; "
            f"write the average elsewhere, e.g. {run_dir / f'avg{last}'}"
        )
    chosen = dirs[-last:]
    _check_one_run(chosen)
    check_apart(output, [f for d in chosen for f in checkpoint.read_files(d, resumable=True)], folder=True)
    check_replaceable(output_path(output), checkpoint.AVERAGE)
    if os.path.lexists(output) and not overwrite:
        raise CheckpointError(f"{output} already exists; pass --overwrite to replace it or choose another --output")
    newest = checkpoint.load(chosen[-1])
    sums = {k: v.double() for k, v in newest.model.state_dict().items() if v.is_floating_point()}
    for path in chosen[:-1]:
        loaded = checkpoint.load(path)
        if loaded.tokenizer.fingerprint() != newest.tokenizer.fingerprint() or loaded.cfg.model != newest.cfg.model:
            raise CheckpointError(
                f"{path} and {chosen[-1]} come from different models or tokenizers; average only checkpoints of one run"
            )
        for k, v in loaded.model.state_dict().items():
            if k in sums:
                sums[k] += v.double()
    state = newest.model.state_dict()
    newest.model.load_state_dict({**state, **{k: (s / last).to(state[k].dtype) for k, s in sums.items()}})
    meta = {"step": newest.meta.get("step"), "averaged": [p.name for p in chosen], "reason": "average"}
    return checkpoint.save(
        output, newest.cfg, newest.tokenizer, newest.model, meta, kind=checkpoint.AVERAGE, retry="run tfm average again"
    )
