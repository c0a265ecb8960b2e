"""Atomic writing: every file and directory tfm writes goes aside first and is renamed into place,
so a crash, a kill or a full disk never leaves a half-written one where a good one was.

Directories are written as ``.NAME.tmp-PID``; the one they replace waits as ``.NAME.old-PID``
until the new one is in place. ``clean_partial`` undoes what an interrupted write left behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import IO, Any

from transformer.errors import OutputError


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A temporary file beside ``path``, renamed onto it when the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def temporary_name(path: Path) -> Path:
    """Where ``atomic_dir`` writes ``path`` before the rename (also used to delete a directory safely)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_dir(path: str | Path, ours: Collection[str] | None = None) -> Iterator[Path]:
    """A fresh temporary directory; when the block ends without error its files are synced and it replaces ``path``.

    ``ours``: ``path`` is a folder the user named (an export, an average), which may hold the user's own files. It is
    replaced only if every entry it holds is one the new folder has too, or one ``ours`` names (what tfm writes there
    besides): an earlier output of the same kind. Anything else is refused, naming it, and nothing is changed.
    Without ``ours`` the folder is tfm's own (a checkpoint in a run directory) and is replaced whatever it holds.
    """
    path = Path(path)
    if path.exists() and not (path.is_dir() or path.is_file()):  # a device or a socket is never replaced
        raise FileExistsError(errno.EEXIST, "not a file or folder, so it is not replaced; write elsewhere", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = temporary_name(path), path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for f in tmp.iterdir():
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if ours is not None and path.is_dir():
            check_replaceable(path, {f.name for f in tmp.iterdir()} | set(ours))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)  # a file that the directory replaced
    fsync_dir(path.parent)


def check_replaceable(folder: Path, names: Collection[str]) -> None:
    """Refuse to replace ``folder`` if it holds an entry not in ``names``: a file of the user's would be lost."""
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in names)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise OutputError(
            f"'{folder}' holds {shown}, which this command does not write, so --overwrite does not replace it; "
            "move them or choose another --output"
        )


def remove_dir(path: Path) -> None:
    """Delete a directory, first renamed aside so a deletion cut short is never mistaken for the real one."""
    doomed = temporary_name(path)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def clean_partial(folder: str | Path) -> list[str]:
    """Undo what an interrupted ``atomic_dir`` or ``remove_dir`` left in ``folder``; return what was done.

    A kill between the two renames leaves the previous directory as ``.NAME.old-PID`` and no
    ``NAME``: it is put back. Temporary ``.NAME.tmp-PID`` directories and ``.old`` copies that
    were already replaced are deleted.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    done = []
    for old in sorted(p for p in folder.glob(".*.old-*") if p.is_dir()):
        target = folder / old.name[1:].rsplit(".old-", 1)[0]
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            done.append(f"removed {old.name}")
        else:
            os.replace(old, target)
            done.append(f"restored {target.name} from {old.name}")
    for tmp in sorted(p for p in folder.glob(".*.tmp-*") if p.is_dir()):
        shutil.rmtree(tmp, ignore_errors=True)
        done.append(f"removed {tmp.name}")
    return done
