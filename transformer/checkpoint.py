"""One self-contained checkpoint directory: saved atomically, loaded safely.

A checkpoint directory holds ``config.yaml`` (the resolved config), ``tokenizer.json``,
``model.safetensors`` (weights, never pickled), ``meta.json`` (step, scores, the
tokenizer's fingerprint) and, for resumable checkpoints, ``trainer.pt`` (optimizer,
schedule, scaler, RNG and data position), read back with ``torch.load(weights_only=True)``.
Everything is written under a temporary name and renamed into place, so a crash
or a full disk never leaves a half-written checkpoint where a good one was, and recorded as tfm's
(``.tfm-files``, transformer.storage.manifest), so that only what tfm wrote is ever deleted or replaced.
"""

from __future__ import annotations

import errno
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from transformer import config_file
from transformer.config import Config
from transformer.errors import CheckpointError, ConfigError, DataError, WriteError
from transformer.model.transformer import Transformer
from transformer.runtime.memory import check_fits
from transformer.storage import manifest
from transformer.storage.files import atomic_dir, remove_dir
from transformer.text.tokenizer import Tokenizer

CONFIG, TOKENIZER, WEIGHTS, META, TRAINER = (
    "config.yaml",
    "tokenizer.json",
    "model.safetensors",
    "meta.json",
    "trainer.pt",
)
STEP_PREFIX = "step_"
EVAL = "eval"  # the folder tfm eval writes its reports into, beside a checkpoint's files
CHECKPOINT, AVERAGE = (
    "checkpoint",
    "average",
)  # the kinds of folder (storage.manifest) a checkpoint is saved as


@dataclass
class Loaded:
    """What a checkpoint directory gives back."""

    cfg: Config
    tokenizer: Tokenizer
    model: Transformer
    meta: dict[str, Any]
    path: Path


def _write_files(
    tmp: Path,
    cfg: Config,
    tokenizer: Tokenizer,
    model: torch.nn.Module,
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None,
) -> None:
    (tmp / CONFIG).write_text(config_file.dump(cfg), encoding="utf-8")
    tokenizer.save(tmp / TOKENIZER)
    save_model(model, str(tmp / WEIGHTS))
    meta = {**meta, "tokenizer_fingerprint": tokenizer.fingerprint(), "torch": torch.__version__}
    if cfg.train.init is not None:  # where the run started (tfm train --init): the weights it was given
        meta["init"] = {"path": cfg.train.init, "fingerprint": cfg.train.init_fingerprint}
    (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER)


def save(
    path: str | Path,
    cfg: Config,
    tokenizer: Tokenizer,
    model: torch.nn.Module,
    meta: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
    kind: str = CHECKPOINT,
    retry: str = "resume with --resume (older checkpoints are intact)",
) -> Path:
    """Write a checkpoint directory atomically; an existing one at ``path`` is replaced once the new one is complete.

    ``kind``: CHECKPOINT, a run's own (one holding files of the user's is kept whole beside it, files.atomic_dir), or
    AVERAGE, a folder the user named (tfm average --output), replaced only when it is an earlier average. ``retry``
    ends the message of a full disk: what to run once space is freed.
    """
    path = Path(path)
    try:
        with atomic_dir(path, kind, units=(EVAL,), keep_foreign=kind == CHECKPOINT) as tmp:
            _write_files(tmp, cfg, tokenizer, model, meta, trainer_state)
    except (WriteError, SafetensorError, RuntimeError) as e:
        # safetensors and torch.save report a failed write in errors of their own (torch's names no cause), so a
        # full disk is told by its errno or by the space left once the partial copy is gone
        need = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        need *= 3 if trainer_state is not None else 1
        free = shutil.disk_usage(path.parent).free if path.parent.is_dir() else 0
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e) or free < need:
            raise CheckpointError(
                f"disk full while saving {path}: about {need:,} bytes needed, {free:,} free; "
                f"free some space and {retry}"
            ) from None
        if isinstance(e, (WriteError, RuntimeError)):
            raise  # a WriteError says it all; a RuntimeError that is no failed write is a bug, keep its traceback
        raise CheckpointError(f"cannot write checkpoint {path}: {e}; check the directory is writable") from None
    return path


def read_files(path: Path, resumable: bool = False) -> list[Path]:
    """The files of the checkpoint ``path`` that loading it reads (with the trainer state: resuming, averaging)."""
    return [path / name for name in (CONFIG, TOKENIZER, WEIGHTS, META, *[TRAINER] * resumable)]


def step_dirs(run_dir: str | Path) -> list[Path]:
    """The run's step checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX) and (p / META).is_file()]
    return sorted(dirs, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def prune(run_dir: str | Path, keep_last: int) -> None:
    """Remove all but the newest ``keep_last`` step checkpoints (``files.clean_partial`` finishes a cut-short
    removal); a file of the user's in one stays where it is."""
    for old in step_dirs(run_dir)[:-keep_last]:
        remove_dir(old)


def read_config(path: Path) -> Config:
    """The resolved config saved in a checkpoint directory."""
    try:
        values = yaml.safe_load((path / CONFIG).read_text(encoding="utf-8")) or {}
        if isinstance(values, dict) and values.get("compile") is False:
            del values["compile"]  # written before train.compile replaced it; it had to be false, so it did nothing
        return config_file.from_dict(values)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{path / CONFIG} is unreadable ({type(e).__name__}); the checkpoint is damaged, use another one"
        ) from None
    except ConfigError as e:
        raise CheckpointError(f"{path / CONFIG}: {e}") from None


def check_files(path: Path, *names: str) -> None:
    """Raise a CheckpointError that lists whichever of ``names`` the directory lacks."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint '{path}' not found; pass a checkpoint directory, e.g. runs/<name>/best")
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        lacks = f"lacks {', '.join(missing)}; it is incomplete, use another checkpoint"
        raise CheckpointError(f"checkpoint '{path}' {_what_else(path) or lacks}")


def _what_else(path: Path) -> str | None:
    """What a folder given as a checkpoint is instead, and which checkpoint to give: a run, its checkpoints folder,
    an export; None for a folder that looks like none of them."""
    steps = step_dirs(path)
    if (path / "best" / META).is_file() or steps:
        best = path / "best" if (path / "best" / META).is_file() else steps[-1]
        return f"is a run directory, not a checkpoint; give one of its checkpoints, e.g. {best}"
    inside = step_dirs(path.parent) if path.name == "checkpoints" else []
    if inside:
        return f"is a run's folder of step checkpoints; give one of them, e.g. {inside[-1]}"
    kind = manifest.kind(path)
    if kind == "export" or (path / "config.json").is_file() or (path / "model.bin").is_file():
        return "is an exported model (for transformers or CTranslate2); give the checkpoint it was exported from"
    return None


def load(path: str | Path, device: str | torch.device = "cpu") -> Loaded:
    """Load config, tokenizer and weights from a checkpoint directory, checking that they belong together."""
    path = Path(path)
    check_files(path, CONFIG, TOKENIZER, WEIGHTS, META)
    cfg = read_config(path)
    try:
        tokenizer = Tokenizer.load(path / TOKENIZER)
    except DataError as e:
        raise CheckpointError(f"{path}: {e}") from None
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / META} is unreadable ({type(e).__name__}); the checkpoint is damaged") from None
    recorded = meta.get("tokenizer_fingerprint")
    if recorded != tokenizer.fingerprint():
        raise CheckpointError(
            f"{path / TOKENIZER} does not match the weights (fingerprint {tokenizer.fingerprint()[:12]} != recorded "
            f"{str(recorded)[:12]}); put back the tokenizer.json saved with this checkpoint"
        )
    check_fits(cfg.model, tokenizer.vocab_size, torch.device(device), False, str(path / CONFIG))
    model = Transformer(cfg.model, tokenizer.vocab_size, tokenizer.pad_id)
    try:
        missing, unexpected = load_model(model, str(path / WEIGHTS), strict=False, device=str(device))
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{path / WEIGHTS} is truncated or corrupt ({str(e).splitlines()[0][:120]}); use another checkpoint"
        ) from None
    if missing or unexpected:
        raise CheckpointError(
            f"{path / WEIGHTS} does not fit the model in {CONFIG} (missing {sorted(missing)[:3]}, unexpected "
            f"{sorted(unexpected)[:3]}); the files come from different runs"
        )
    weights = model.state_dict()
    if bad := next((k for k, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()), None):
        raise CheckpointError(
            f"{path / WEIGHTS} holds non-finite values (NaN or inf) in {bad}; these weights cannot translate or "
            "train: use an earlier checkpoint"
        )
    model.to(device)
    return Loaded(cfg, tokenizer, model, meta, path)


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """Read ``trainer.pt`` without unpickling arbitrary objects (weights_only=True)."""
    path = Path(path)
    check_files(path, TRAINER)
    try:
        return torch.load(path / TRAINER, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{path / TRAINER} refused: not a plain tensor/number state ({first}); it is corrupt or unsafe, "
            "resume from another checkpoint"
        ) from None


def newest(runs: str | Path) -> Path:
    """The checkpoint ``tfm translate`` uses by default: the newest run's ``best``, else its newest step."""
    runs = Path(runs)
    runs_found = [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []
    candidates = []
    for run in runs_found:
        best = run / "best"
        chosen = best if (best / META).is_file() else (step_dirs(run)[-1] if step_dirs(run) else None)
        if chosen is not None:
            candidates.append(chosen)
    if not candidates:
        raise CheckpointError(
            f"no checkpoint found under {runs}/; train one first "
            "(tfm train --config configs/quickstart.yaml) or pass --checkpoint DIR"
        )
    return max(candidates, key=lambda p: (p / META).stat().st_mtime)
