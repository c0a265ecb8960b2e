"""TensorBoard event files of a run, written from the records that go to log.jsonl (``tensorboard --logdir runs``).

TensorBoard is optional (the ``tensorboard`` extra): ``train.tensorboard`` null writes events when it is
installed, true requires it, false never writes them. The events go to ``<run>/tensorboard``; each record is
flushed as it is written, so they hold what log.jsonl holds however the run ends. A run that resumes opens a new
event file that starts with a purge from its first update: TensorBoard then drops what an earlier run logged past
the checkpoint resumed from, as the resumed run logs those updates again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformer.errors import TrainError
from transformer.storage import manifest

FOLDER = "tensorboard"  # in the run directory
CONFIG_TAG = "config"
# The scalars a record of each kind gives: its key, and the tag TensorBoard shows it under.
SCALARS = {
    "train": {
        "loss": "train/loss",
        "ppl": "train/ppl",
        "lr": "train/lr",
        "grad_norm": "train/grad_norm",
        "target_tokens_per_s": "train/target_tokens_per_s",
    },
    "valid": {
        "valid_loss": "valid/loss",
        "valid_ppl": "valid/ppl",
        "valid_bleu": "valid/bleu",
        "valid_chrf": "valid/chrf",
    },
}


def _summary_writer() -> Any:
    """torch's SummaryWriter class, or None where the tensorboard package is missing (or too old for torch)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter


def wanted(setting: bool | None) -> bool:
    """Whether a run writes events under ``train.tensorboard`` (null: when tensorboard is installed)."""
    if setting is False:
        return False
    if _summary_writer() is not None:
        return True
    if setting:
        raise TrainError(
            "train.tensorboard: true, but the tensorboard package is not installed; "
            "pip install tensorboard, or set train.tensorboard: false"
        )
    return False


def _check_writable(folder: Path) -> None:
    """The events folder can be written into (its writer writes from a thread of its own, whose failure would be a
    traceback, not tfm's line): a file is made there and removed."""
    try:
        folder.mkdir(exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise TrainError(
            f"{folder} cannot be written ({e.strerror or e}); make it writable, or set train.tensorboard: false"
        ) from None


class TensorBoardLog:
    """Writes a run's records as scalars into ``<run_dir>/tensorboard``, from update ``first_step`` on; the run's
    config (YAML) is a text at that step."""

    def __init__(self, run_dir: Path, first_step: int, config_yaml: str) -> None:
        writer = _summary_writer()
        folder = run_dir / FOLDER
        _check_writable(folder)
        before = set(folder.iterdir()) if folder.is_dir() else set()
        self.writer = writer(str(folder), purge_step=first_step)
        # the event file the writer made: recorded as tfm's (transformer.storage.manifest), as it grows
        self.run_dir, self.files = run_dir, [f"{FOLDER}/{p.name}" for p in sorted(set(folder.iterdir()) - before)]
        # indented four spaces: TensorBoard renders text as Markdown, and this keeps the YAML as it is
        self.writer.add_text(CONFIG_TAG, "\n".join(f"    {line}" for line in config_yaml.splitlines()), first_step)
        self.writer.flush()
        manifest.record(run_dir, *self.files, grows=True)

    def write(self, entry: dict[str, Any]) -> None:
        """The scalars of one log record, on disk before this returns."""
        for key, tag in SCALARS.get(entry["kind"], {}).items():
            if key in entry:
                self.writer.add_scalar(tag, entry[key], entry["step"])
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file, and record what it holds."""
        self.writer.close()
        manifest.record(self.run_dir, *self.files, grows=True)
