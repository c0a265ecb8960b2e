"""The run directory at the start of training: a fresh one, one wiped by --overwrite, or one to --resume.

A run directory belongs to tfm only, and to one process at a time: ``locked`` holds it for the run
(a second ``tfm train`` on it is refused, naming the holder's PID; the kernel drops the lock with the
process, however it ends). Every file tfm writes there is recorded (transformer.storage.manifest), each checkpoint in a
record of its own. Starting again (with --overwrite, or after a start that saved no checkpoint) removes what tfm
wrote and nothing else: a run that holds a file tfm did not write, at any depth, is refused, naming it, so that a
name that happens to match a folder of the user's, or a note left in a checkpoint, never costs them a file.

Resuming repairs what an interrupted save left behind, takes the newest checkpoint that loads whole
(damaged newer ones are renamed ``damaged-step_N`` and kept for inspection), and refuses a config that
changes what the checkpoint's weights and tokenizer mean.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

try:
    import fcntl
except ImportError:  # Windows: no flock, so no lock
    fcntl = None

from transformer import checkpoint
from transformer.config import Config
from transformer.config_file import to_dict
from transformer.errors import CheckpointError, TrainError
from transformer.storage import manifest
from transformer.storage.files import atomic_file, clean_partial
from transformer.storage.manifest import LOCK

# Config sections that fix what a checkpoint's weights and tokenizer mean; resume refuses changes here.
FROZEN_SECTIONS = ("model", "tokenizer")
# What a run directory is recorded as (transformer.storage.manifest): its plain folders, and its sub-folders that are
# checkpoints with manifests of their own (best, averages, step checkpoints, damaged ones set aside by --resume).
RUN = "run"
FOLDERS = ("checkpoints", "tensorboard")
UNITS = ("best", r"avg\d+", r"checkpoints/step_\d+", r"checkpoints/damaged-step_\d+")
# The names an earlier tfm, which kept no manifest, wrote in a run directory: such a run may still be resumed (its
# files stay unrecorded, so tfm never deletes them).
_OWN = r"(config\.yaml|tokenizer\.json|log\.jsonl|split\.json|training\.png|checkpoints|best|avg\d+|tensorboard)"
EARLIER_NAMES = re.compile(rf"{_OWN}|\.{_OWN}\.(tmp-\d+|old-\d+|\w{{8}})|\.lock")


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process while the block runs, making it (and its record) if need be.

    A folder that is no run of tfm's is refused before anything is written into it. A start that fails before a
    checkpoint leaves nothing behind: a run directory it made is removed again, and from an empty folder of the
    user's that it made a run of, what it wrote (its record and lock among them) is removed and the folder stays.
    """
    _refuse_foreign(run_dir)
    made = [p for p in (run_dir, *run_dir.parents) if not p.exists()]  # this folder and the ones above it made here
    run_dir.mkdir(parents=True, exist_ok=True)
    recorded = manifest.read(run_dir) is None  # the record, and so every file in the folder, is this start's
    if recorded:
        manifest.create(run_dir, RUN, FOLDERS, UNITS)
    try:
        with _flock(run_dir):
            yield
    except BaseException:
        if (made or recorded) and not holds_work(run_dir) and manifest.first_foreign(run_dir) is None:
            if made:
                manifest.delete(run_dir)
            else:
                for entry in run_dir.iterdir():
                    if entry.name != manifest.MANIFEST:
                        manifest.delete(entry) if entry.is_dir() else entry.unlink()
                (run_dir / manifest.MANIFEST).unlink(missing_ok=True)
            for parent in made[1:]:  # run_dir's own parents, if nothing else came into them (a token cache)
                with contextlib.suppress(OSError):
                    parent.rmdir()
        raise


@contextlib.contextmanager
def _flock(run_dir: Path) -> Iterator[None]:
    """The lock on ``run_dir/.lock``: a second ``tfm train`` on it is refused, naming the holder's PID (the kernel
    drops the lock with the process, however it ends)."""
    if fcntl is None:
        yield
        return
    with open(run_dir / LOCK, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise TrainError(
                f"run directory {run_dir} is in use by another tfm train (PID {holder}); wait for it to end, "
                "or choose another --set name=<new name>"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield  # closing the file drops the lock


def prepare(run_dir: Path, resume: bool, overwrite: bool, log: Callable[[str], None]) -> Path | None:
    """Check ``run_dir`` against --resume/--overwrite; return the checkpoint to resume from, if resuming."""
    if resume:
        for folder in (run_dir, run_dir / "checkpoints"):  # what a kill -9 mid-save left behind
            for note in clean_partial(folder):
                log(f"left by an interrupted save: {note}")
        existing = checkpoint.step_dirs(run_dir)
        if not existing:
            raise TrainError(f"--resume: no checkpoint in {run_dir}/checkpoints; start without --resume")
        return newest_intact(run_dir, existing, log)
    entries = [p for p in run_dir.iterdir() if p.name not in (LOCK, manifest.MANIFEST)] if run_dir.exists() else []
    if entries:
        if not overwrite and holds_work(run_dir):
            raise TrainError(
                f"run directory {run_dir} already exists; pass --resume to continue it, "
                "--overwrite to start again, or --set name=<new name>"
            )
        if (foreign := manifest.first_foreign(run_dir)) is not None:
            raise TrainError(
                f"run directory {run_dir} holds {foreign}, which tfm did not write (or an earlier tfm wrote without "
                "recording it), so starting again would delete it; move it, or choose another --set name=<new name>"
            )
        if not overwrite:
            log(f"{run_dir} holds no checkpoint (a start that was interrupted); starting afresh")
        for p in entries:
            manifest.delete(p)
        manifest.create(run_dir, RUN, FOLDERS, UNITS)
    run_dir.mkdir(parents=True, exist_ok=True)
    return None


def write_file(run_dir: Path, name: str, text: str) -> None:
    """Write ``run_dir/name`` atomically and record it as tfm's."""
    with atomic_file(run_dir / name) as f:
        f.write(text)
    manifest.record(run_dir, name)


def _refuse_foreign(run_dir: Path) -> None:
    """Refuse a folder that is no run directory: one that holds entries but no run's record (unless all it holds
    are the names an earlier tfm wrote in a run)."""
    if not run_dir.is_dir() or manifest.kind(run_dir) == RUN:
        return
    if (run_dir / manifest.MANIFEST).is_dir():
        raise TrainError(
            f"run directory {run_dir}: its record {manifest.MANIFEST} is a folder, which tfm never makes; move it out "
            "of the run directory (tfm reads nothing from it) and run again"
        )
    # a record that cannot be read (damaged) is tfm's own: the run's files are then unknown, never foreign
    names = (p.name for p in run_dir.iterdir() if p.name != manifest.MANIFEST)
    if others := sorted(name for name in names if not EARLIER_NAMES.fullmatch(name)):
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise TrainError(
            f"run directory {run_dir} holds files tfm did not write ({shown}), which it never deletes; "
            "choose another --set name=<new name> or run_dir=<folder>, or move them"
        )


def holds_work(run_dir: Path) -> bool:
    """Whether a run directory has anything worth keeping: a step checkpoint, a best one, or an average."""
    return bool(checkpoint.step_dirs(run_dir)) or any(
        p.is_dir() and (p / checkpoint.META).is_file() for p in run_dir.iterdir()
    )


def newest_intact(run_dir: Path, step_dirs: list[Path], log: Callable[[str], None]) -> Path:
    """The newest of ``step_dirs`` that loads whole; damaged newer ones are renamed ``damaged-step_N``, kept."""
    problems = []
    for path in reversed(step_dirs):
        try:
            checkpoint.load(path, "cpu")
            checkpoint.load_trainer_state(path)
        except CheckpointError as e:
            aside = path.with_name(f"damaged-{path.name}")
            path.rename(aside)
            log(f"{path.name} is damaged ({e}); moved to {aside} and resuming from an older checkpoint")
            problems.append(str(e))
            continue
        return path
    raise TrainError(
        f"--resume: every checkpoint in {run_dir}/checkpoints is damaged ({problems[0]}); "
        "start without --resume, or restore one from a backup"
    )


def check_compatible(cfg: Config, ckpt_dir: Path) -> None:
    """Refuse to resume ``ckpt_dir`` under a config whose model, tokenizer or languages differ from its own."""
    new, old = to_dict(cfg), to_dict(checkpoint.read_config(ckpt_dir))
    diffs = [k for s in FROZEN_SECTIONS for k in _differences({s: old[s]}, {s: new[s]})]
    diffs += [k for k in _differences(old["data"], new["data"]) if k.startswith(("src_lang", "tgt_lang"))]
    if diffs:
        raise TrainError(
            f"--resume refused: the config changed what the checkpoint means: {'; '.join(diffs)}; "
            "restore these values or start a new run"
        )


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts, each as ``key (old -> new)``."""
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            keys.append(f"{prefix}{k} ({a!r} -> {b!r})")
    return keys
