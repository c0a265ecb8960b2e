"""Every error a user can fix, in one place: the CLI prints the message on one line and exits 2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


class UserError(Exception):
    """A problem with the user's input, config, data or files; the message names it and the fix."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or read, with the reason and the fix in one line."""


class ConfigError(UserError, ValueError):
    """A config that cannot be used, with a message that says why and how to fix it."""


class DataError(UserError, ValueError):
    """A corpus or tokenizer file that cannot be used; the message names the problem and the fix."""


class DistributedError(UserError, RuntimeError):
    """Distributed training cannot start as configured; the message says why and what to do."""


class EvalError(UserError, ValueError):
    """Hypotheses and references that cannot be scored together."""


class ExportError(UserError, RuntimeError):
    """An export that cannot be done, with the reason and the fix."""


class OutputError(UserError):
    """An output that would replace files of the user's; the message names them and the fix."""


class WriteError(OutputError):
    """An output that could not be written (a full disk, a read-only place); ``errno`` says which."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class PlotError(UserError, RuntimeError):
    """A picture cannot be drawn; the message says why and what to do."""


class TrainError(UserError, RuntimeError):
    """Training cannot start or go on; the message says why and what to do."""


class TranslateError(UserError, ValueError):
    """An input the translator refuses under the current settings."""


def out_of_memory(e: BaseException) -> bool:
    """Whether an exception is an allocation failure (torch raises RuntimeError for a CPU one, OutOfMemoryError,
    a RuntimeError, for a GPU one)."""
    return isinstance(e, MemoryError) or "out of memory" in str(e) or "can't allocate memory" in str(e)


@contextlib.contextmanager
def naming(path: Path | str) -> Iterator[None]:
    """Name ``path`` in an OSError of the block that names no file (a write or flush on a full disk), so that the
    command's one line can say which output failed; subclasses (a download's errors) pass unchanged."""
    try:
        yield
    except OSError as e:
        if type(e) is not OSError or e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
