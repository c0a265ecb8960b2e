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

    Ctrl-C outside the places that handle it themselves (loading data, a model, a tokenizer) exits
    130 with one line instead of click's "Aborted!" and exit code 1.
    """
    try:
        yield
    except UserError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise typer.Exit(130) from None
