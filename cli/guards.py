"""Checks on what a user typed, made before any work starts, so that bad input costs nothing and loses nothing."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

import typer

from cli.exits import fail
from transformer.config import out_of_range
from transformer.storage.files import cannot_write, check_apart
from transformer.storage.manifest import holder, is_own

DECODING_PRECISIONS = "fp32|bf16|fp16|int8|auto (int8: CPU; auto: the fastest here, measured once)"


def check_input(path: Path, what: str = "input file") -> None:
    """An existing, readable file, pipe or terminal; not a directory or an endless device such as /dev/zero."""
    if not path.exists():
        fail(f"{what} '{path}' not found; pass an existing file with one sentence per line")
    if path.is_dir():
        fail(f"{what} '{path}' is a directory; pass a file with one sentence per line")
    if not os.access(path, os.R_OK):
        fail(f"{what} '{path}' is not readable; check its permissions")
    if _endless_device(path):
        fail(f"{what} '{path}' is a device that never ends (such as /dev/zero), not lines of text; pass a file")


def read_pairs(src: Path, tgt: Path) -> tuple[list[str], list[str]]:
    """The lines of ``--src`` and ``--tgt``, one target a source line; files of different lengths are refused."""
    sources, targets = _read_lines(src, "--src"), _read_lines(tgt, "--tgt")
    if len(sources) != len(targets):
        fail(f"--src {src} has {len(sources)} lines and --tgt {tgt} {len(targets)}; give one target a source line")
    return sources, targets


def _read_lines(path: Path, flag: str) -> list[str]:
    """The lines of a UTF-8 text file given as ``flag`` (checked as ``check_input`` does); a line that is not UTF-8
    is refused naming it."""
    check_input(path, flag)
    raw = path.read_bytes().splitlines()
    lines = []
    for no, line in enumerate(raw, 1):
        try:
            lines.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError:
            fail(f"{flag} {path} line {no}: invalid UTF-8; re-encode the file as UTF-8")
    return lines


def _endless_device(path: Path) -> bool:
    """A character device that reads forever (/dev/zero, /dev/full, /dev/urandom): not a terminal, not /dev/null.

    Stat through the path as given: a pipe (``/dev/stdin``, ``<(...)``) resolves to a name such as
    ``/proc/PID/fd/pipe:[N]`` that cannot be opened again.
    """
    if not stat.S_ISCHR(path.stat().st_mode):
        return False
    real = path.resolve()
    terminal = real.name.startswith("tty") or real.parent.name == "pts"
    return not terminal and real != Path("/dev/null")


def check_output(path: Path, overwrite: bool, inputs: Iterable[Path | None] = (), flag: str = "--output") -> None:
    """A file tfm may write: not what the command reads (``files.check_apart``), not a directory, not a file of a
    folder tfm wrote (a run's log, another checkpoint's weights: ``--overwrite`` or not), in a folder that exists and
    is writable, and not an existing file unless ``overwrite`` (devices such as /dev/null are written as they are)."""
    check_apart(path, inputs, flag)
    if path.is_dir():
        fail(f"{flag} '{path}' is a directory; give a file name")
    if path.is_file() and (kind := holder(path)) is not None:
        fail(f"{flag} '{path}' is a file of a {kind} folder tfm wrote, which needs it as it is; write elsewhere")
    if path.exists() and path.is_file() and not overwrite:
        fail(f"{flag} '{path}' exists; pass --overwrite to replace it, or choose another file")
    check_folder(path.parent, flag)


def check_reports(reports: list[Path], overwrite: bool, inputs: Iterable[Path | None]) -> None:
    """Reports ``tfm eval`` may write: none lands on what it reads, and one already there is replaced only with
    ``overwrite`` and only if tfm wrote it (transformer.storage.manifest)."""
    for report in reports:
        check_apart(report, inputs, "--output-dir")
    if there := [r for r in reports if os.path.lexists(r)]:
        if not overwrite:
            fail(
                f"a report is already in {there[0]}; pass --overwrite to replace it, or --output-dir to write elsewhere"
            )
        if (foreign := next((r for r in there if not is_own(r)), None)) is not None:
            fail(
                f"{foreign} was not written by tfm (or was changed since), so --overwrite does not replace it; "
                "move it, or pass another --output-dir"
            )


def check_data_dir(data_dir: str | None, data_format: str) -> None:
    """``--data-dir`` where Multi30k is read from TFM_MULTI30K, which outranks it (text/multi30k.py): refused when
    the two name different folders, so that the corpus read is the one the command line names."""
    env = os.environ.get("TFM_MULTI30K")
    if data_dir and env and data_format == "multi30k" and os.path.realpath(data_dir) != os.path.realpath(env):
        fail(
            f"--data-dir {data_dir} and TFM_MULTI30K={env} name different Multi30k folders, and TFM_MULTI30K is the "
            "one read; unset TFM_MULTI30K, or leave --data-dir out"
        )


def check_folder(folder: Path, flag: str) -> None:
    """A folder that exists and that this process may write into."""
    folder = folder if str(folder) else Path(".")
    if folder.exists() and not folder.is_dir():
        fail(f"{flag}: '{folder}' is a file, not a folder; name a folder to write the reports into")
    if not folder.is_dir():
        fail(f"{flag}: folder '{folder}' does not exist; create it or choose another place")
    if not os.access(folder, os.W_OK | os.X_OK):
        fail(f"{flag}: folder '{folder}' is not writable; choose another place")


def check_creatable(folder: Path, what: str) -> None:
    """A folder that exists or can be made: its nearest existing ancestor is a writable directory."""
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        fail(f"{what} '{folder}' cannot be made: '{ancestor}' is a file, not a folder; choose another place")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        fail(f"{what} '{folder}' cannot be written: '{ancestor}' is read-only or not ours; choose another place")


def check_stdout(inputs: Iterable[Path | None] = ()) -> None:
    """Standard output is open (``>&-`` closes it, and Python then has no sys.stdout) and is none of ``inputs``
    (``>> in.de`` would grow the file as it is read)."""
    if sys.stdout is None:
        fail("standard output is closed; pass --output FILE or leave stdout open")
    try:
        out = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return  # not a file descriptor (a test's captured stream)
    for source in inputs:
        with contextlib.suppress(OSError):
            if source is not None and stat.S_ISREG(out.st_mode) and os.path.samestat(out, os.stat(source)):
                fail(f"standard output is the file '{source}', which this command reads; redirect it elsewhere")


def write_failed(path: Path | str, e: OSError) -> None:
    """One line for an output that could not be written (a full disk, a closed pipe, a read-only file system)."""
    fail(str(cannot_write(path, e)))


def within(key: str) -> Callable[[typer.CallbackParam, Any], Any]:
    """A callback that holds a flag to the range ``config.RANGES`` declares for ``key`` (``--beam`` to
    ``decode.beam``'s): the one range a config file's value meets too, refused in tfm's one line."""

    def check(param: typer.CallbackParam, value: Any) -> Any:
        for one in value if isinstance(value, list) else [value]:  # a repeatable flag gives a list
            if one is not None and (want := out_of_range(key, one)) is not None:
                shown = f"{one:g}" if isinstance(one, float) else one  # as typed: -1, not -1.0
                fail(f"{param.opts[0]} {shown} is out of range; it must be {want}")
        return value

    return check


def count(high: int | Callable[[], int]) -> Callable[[typer.CallbackParam, Any], Any]:
    """A callback for a count on the command line that is no config value (--last, --nproc, --layer): 1 to ``high``
    (or what ``high()`` says here), refused in tfm's one line rather than Typer's usage box."""

    def check(param: typer.CallbackParam, value: int | None) -> int | None:
        top = high() if callable(high) else high
        if value is not None and not 1 <= value <= top:
            fail(f"{param.opts[0]} {value} is out of range; it must be 1 to {top:,}")
        return value

    return check
