"""The decode settings on the command line: each flag is a ``DecodeConfig`` field's (``--top-k`` for ``top_k``), held to
the range the field has in a config file, and reaches the Translator by the field's name alone."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from cli.guards import within
from transformer.config import RANGES, DecodeConfig

FIELDS = tuple(f.name for f in dataclasses.fields(DecodeConfig))


def flag(name: str) -> str:
    """The flag of decode setting ``name``: ``--top-k`` for ``top_k``."""
    return "--" + name.replace("_", "-")


def option(name: str, help: str, *aliases: str, default: Any = None) -> Any:
    """A command's parameter for decode setting ``name`` (the parameter carries that name): the field's flag (and
    ``aliases``), checked against the field's range where it has one."""
    if name not in FIELDS:
        raise ValueError(f"{name!r} is not a decode setting; the settings are DecodeConfig's fields")
    key = f"decode.{name}"
    return typer.Option(default, flag(name), *aliases, callback=within(key) if key in RANGES else None, help=help)


def settings(values: dict[str, Any]) -> dict[str, Any]:
    """The decode settings among a command's arguments (``locals()``): those named after ``DecodeConfig``'s fields,
    given over the checkpoint's."""
    return {name: values[name] for name in FIELDS if name in values}
