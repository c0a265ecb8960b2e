"""Turn the library's user errors, and the command line's own (a flag's value of the wrong type, an unknown flag or
command), into one line on stderr and exit code 2, never a traceback or a usage box."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, NoReturn

import typer
from typer.core import TyperGroup

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


class OneLineErrors(TyperGroup):
    """tfm's commands, whose usage errors (``--beam abc``, ``--bogus``, ``tfm trian``) are tfm's one line."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors():
            args = [*(getattr(ctx, "_protected_args", None) or ctx.protected_args), *ctx.args]
            if args and (command := self.get_command(ctx, args[0])) is not None:
                _given_once(command, args[1:])
            return super().invoke(ctx)


def _given_once(command: Any, args: list[str]) -> None:
    """Refuse a flag that takes one value given twice (``--beam 3 --beam 5``): click would keep the last silently."""
    single = {
        opt: param.name
        for param in command.params
        if getattr(param, "multiple", True) is False and not getattr(param, "count", False)
        for opt in (*param.opts, *param.secondary_opts)
    }
    first: dict[str, str] = {}
    for token in args:
        if token == "--":
            return
        name = token.split("=", 1)[0]
        if name in single:
            if single[name] in first:
                also = "" if first[single[name]] == name else f" (as {first[single[name]]} first)"
                fail(f"{name} is given twice{also}; it takes one value: give it once")
            first[single[name]] = name


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """click's UsageError as one line; known by name, as Typer may bring its own copy of click."""
    try:
        yield
    except Exception as e:
        names = {kind.__name__ for kind in type(e).__mro__}
        if "UsageError" not in names or "NoArgsIsHelpError" in names:  # `tfm` alone: the help, as asked
            raise
        message = e.format_message().rstrip(".")  # type: ignore[attr-defined]
        ctx = getattr(e, "ctx", None)
        fail(f"{message[:1].lower()}{message[1:]}; see {ctx.command_path if ctx else 'tfm'} --help")
