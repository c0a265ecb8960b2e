"""Turn the library's user errors into one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, NoReturn

import typer

from transformer.errors import UserError


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Catch UserError (config, data, checkpoint, translation, eval) and exit 2 with its message.

    A file-system error about a path (a folder that cannot be made, a read-only file system) is one
    line too, where no code closer to it said more. Ctrl-C outside the places that handle it
    themselves (loading data, a model, a tokenizer) exits 130 with one line instead of click's
    "Aborted!" and exit code 1.
    """
    try:
        yield
    except UserError as e:
        fail(str(e))
    except OSError as e:
        if e.filename is None:  # not about a path the user gave: a bug, keep its traceback
            raise
        fail(f"{e.strerror or e}: '{e.filename}'; check the path, its permissions and the free space")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise typer.Exit(130) from None
