"""Writing without losing anything: every file and folder tfm writes goes aside first and is renamed into place, is
recorded as tfm's (transformer.storage.manifest), follows the user's umask, and never lands on what the command reads.

A file is written as ``.NAME.tmp-PID``, a folder as ``.NAME.tmp-PID/``; the folder it replaces waits as
``.NAME.old-PID`` until the new one is in place. A crash, a kill or a full disk never leaves a half-written one
where a good one was, and ``clean_partial`` (run by the next write into the same folder) removes what an
interrupted write left. A folder is replaced only when all it holds is tfm's and of the same kind; a failed write
is one ``WriteError`` naming the place and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from transformer.errors import OutputError, WriteError, naming
from transformer.storage import manifest

STDIN = Path("/dev/stdin")
NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device", as writers that raise no OSError still say it


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give a file tfm wrote the mode the user's umask asks for (a temporary file is made 0600, as are the files of
    some writers): a checkpoint copied to another user must be readable where the umask says so."""
    os.chmod(path, 0o666 & ~umask())


def cannot_write(path: Path | str, e: OSError) -> WriteError:
    """One line for an output that could not be written: the place, the reason and the fix."""
    fixes = {
        errno.ENOSPC: "no space left on the device; free some space or write elsewhere",
        errno.EDQUOT: "disk quota exceeded; free some space or write elsewhere",
        errno.EROFS: "the file system is read-only; write elsewhere",
        errno.EACCES: "permission denied; write elsewhere or check the folder's permissions",
        errno.EPERM: "permission denied; write elsewhere or check the folder's permissions",
    }
    reason = fixes.get(e.errno, f"{e.strerror or e}; write elsewhere")
    return WriteError(f"cannot write {path}: {reason}", e.errno)


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before the rename into place (also where a folder waits while it is deleted)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A temporary file beside ``path``, renamed onto it when the block ends without error (a link's target is
    written, and the link kept; a device or a pipe such as /dev/null is written as it is, never replaced); a write
    failing without naming a file (a full disk) names ``path``."""
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    encoding = None if "b" in mode else "utf-8"
    if path.exists() and not path.is_file():
        with naming(path), open(path, mode, encoding=encoding) as f:
            yield f
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with naming(path), open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        follow_umask(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_files(folder: Path, texts: dict[str, str], kind: str) -> None:
    """Write small text files into ``folder`` together and record them as tfm's (a folder without a record gets one of
    ``kind``): each is written aside, and only once all are complete are they renamed into place, so a full disk
    leaves none of them, and no empty file that a next run would take for a finished one."""
    temps: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if manifest.read(folder) is None:
            manifest.record(folder, kind_=kind)
        clean_partial(folder)
        for name, text in texts.items():
            temps.append(tmp := temporary_name(folder / name))
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            follow_umask(tmp)
        for name, tmp in zip(texts, temps):
            os.replace(tmp, folder / name)
        manifest.record(folder, *texts)
        fsync_dir(folder)
    except OSError as e:
        raise cannot_write(folder, e) from None
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)


def output_path(path: str | Path, flag: str = "--output") -> Path:
    """The place a folder ``path`` names: absolute, its links followed (a link is never replaced by a folder); a
    link that loops or points nowhere, and the root, are refused."""
    p = Path(os.path.abspath(path))
    if p.is_symlink():
        try:
            p.stat()
        except OSError as e:
            why = "loops" if e.errno == errno.ELOOP else "points nowhere"
            raise OutputError(f"{flag} '{path}' is a symbolic link that {why}; give a folder's path") from None
    real = Path(os.path.realpath(p))
    if real.parent == real:
        raise OutputError(f"{flag} '{path}' is the root of the file system; give a folder to write into")
    return real


def check_replaceable(path: Path, kind: str, flag: str = "--output") -> None:
    """Refuse to replace ``path`` unless it is a folder that holds only what tfm wrote, of the same ``kind`` (an
    earlier export, an earlier average): the user's files are never deleted, whatever the flags."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        what = "a file" if path.is_file() else "not a folder (a device, a link or a socket)"
        raise OutputError(f"{flag} '{path}' is {what}, so it is not replaced by a folder; choose another {flag}")
    if (foreign := manifest.first_foreign(path)) is not None:
        raise OutputError(
            f"{flag} '{path}' holds '{foreign}', which tfm did not write, so it is not replaced or deleted; "
            f"move it, or choose another {flag}"
        )
    found = manifest.kind(path)
    if found not in (None, kind):
        raise OutputError(f"{flag} '{path}' is a {found} tfm wrote, not an earlier {kind}; choose another {flag}")


@contextlib.contextmanager
def atomic_dir(path: str | Path, kind: str, units: Iterable[str] = (), keep_foreign: bool = False) -> Iterator[Path]:
    """A fresh temporary folder; when the block ends without error its files are synced, recorded as a ``kind`` of
    tfm's (``units``: patterns of sub-folders written later with manifests of their own) and it replaces ``path``.

    ``path`` must be free, or a folder that ``check_replaceable`` lets go: anything else is refused and nothing is
    changed. ``keep_foreign`` (a folder of a run, replaced as training goes on): a folder that holds files of the
    user's is kept whole as ``NAME.kept-N`` instead of refused.
    """
    path = output_path(path)
    if not keep_foreign:
        check_replaceable(path, kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_partial(path.parent)
        tmp, old = temporary_name(path), path.with_name(f".{path.name}.old-{os.getpid()}")
        manifest.delete(tmp)
        tmp.mkdir()
        manifest.create(tmp, manifest.PARTIAL)
    except OSError as e:
        raise cannot_write(path, e) from None
    try:
        yield tmp
        _settle(tmp)
        manifest.write(tmp, manifest.survey(tmp, kind, units))
        if keep_foreign and os.path.lexists(path) and manifest.first_foreign(path) is not None:
            os.replace(path, _kept_name(path))
        else:
            check_replaceable(path, kind)  # again: the folder may have changed while this one was written
    except OSError as e:
        manifest.delete(tmp)
        raise cannot_write(path, e) from None
    except Exception as e:
        manifest.delete(tmp)
        if NO_SPACE in str(e):  # a writer's own error for a full disk (safetensors', CTranslate2's)
            raise cannot_write(path, OSError(errno.ENOSPC, NO_SPACE)) from None
        raise
    except BaseException:
        manifest.delete(tmp)
        raise
    if path.exists():
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except OSError as e:
        if old.exists():
            os.replace(old, path)
        manifest.delete(tmp)
        raise cannot_write(path, e) from None
    manifest.delete(old)
    fsync_dir(path.parent)


def _settle(folder: Path) -> None:
    """Every file under ``folder`` on disk, with the mode the umask asks for."""
    for root, _, names in os.walk(folder):
        for name in names:
            f = Path(root) / name
            follow_umask(f)
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def _kept_name(path: Path) -> Path:
    """A free name beside ``path`` under which a folder holding the user's files is kept."""
    n = 1
    while os.path.lexists(kept := path.with_name(f"{path.name}.kept-{n}")):
        n += 1
    return kept


def remove_dir(path: Path) -> list[Path]:
    """Delete what tfm wrote in a folder of its own, first renamed aside so that a deletion cut short is never
    mistaken for the real one; files of the user's stay where they are. Returns those kept."""
    if manifest.first_foreign(path) is not None:
        return manifest.discard(path)
    doomed = temporary_name(path)
    os.replace(path, doomed)
    manifest.delete(doomed)
    return []


def _alive(pid: int) -> bool:
    """Whether process ``pid``, another than this one, runs: its temporary files may still be being written (this
    process writes one thing at a time, so what it left is from a write that failed)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


def clean_partial(folder: str | Path) -> list[str]:
    """Undo what an interrupted ``atomic_dir``, ``atomic_file`` or ``remove_dir`` left in ``folder``, whose
    process is gone; return what was done.

    A kill between the two renames leaves the previous folder as ``.NAME.old-PID`` and no ``NAME``: it is put
    back. Temporary folders (each holds a manifest from its first moment, or that manifest's own temporary file if
    killed while writing it), ``.old`` copies already replaced, and, in a folder of tfm's, temporary files are
    deleted. Anything else is the user's and stays.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    done, recorded = [], manifest.read(folder) is not None
    for entry in sorted(folder.iterdir()):
        match = manifest.TEMPORARY.fullmatch(entry.name)
        if match is None or _alive(int(match[3])) or entry.is_symlink():
            continue
        if entry.is_dir() and manifest.read(entry) is not None:
            target = folder / match[1]
            if match[2] == "old" and not os.path.lexists(target):
                os.replace(entry, target)
                done.append(f"restored {target.name} from {entry.name}")
            elif manifest.first_foreign(entry) is None:
                manifest.delete(entry)
                done.append(f"removed {entry.name}")
        elif entry.is_dir() and _killed_recording(entry, match[3]):
            (entry / f"{manifest.MANIFEST}.tmp-{match[3]}").unlink()
            entry.rmdir()
            done.append(f"removed {entry.name}")
        elif recorded and stat.S_ISREG(entry.lstat().st_mode):
            entry.unlink()
            done.append(f"removed {entry.name}")
    return done


def _killed_recording(folder: Path, pid: str) -> bool:
    """Whether ``folder`` holds only its first record half-written, as a kill inside ``manifest.create`` leaves it."""
    return [e.name for e in folder.iterdir()] == [f"{manifest.MANIFEST}.tmp-{pid}"]


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file however spelt (links, hard links, ``/dev/stdin``); devices such as
    /dev/null and terminals, which reading does not use up, are not counted."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino) and not stat.S_ISCHR(sa.st_mode)


def _inside(inner: Path, folder: Path) -> bool:
    """Whether ``inner`` lies within ``folder`` (compared by device and inode, so links and mounts count)."""
    try:
        target = os.stat(folder)
    except OSError:
        return Path(os.path.realpath(inner)).is_relative_to(os.path.realpath(folder))
    if not stat.S_ISDIR(target.st_mode):
        return False
    for parent in Path(os.path.realpath(inner)).parents:
        with contextlib.suppress(OSError):
            if os.path.samestat(os.stat(parent), target):
                return True
    return False


def clash(output: str | Path, inputs: Iterable[str | Path | None], folder: bool = False) -> tuple[Path, str] | None:
    """The first of ``inputs`` (what the command reads) that writing ``output`` would overwrite or delete, with how:
    ``is`` (the same file) or ``holds`` (``folder``: ``output`` is a folder the command replaces, and it holds one);
    None where there is none."""
    for source in inputs:
        if source is None:
            continue
        if _same(Path(output), Path(source)):
            return Path(source), "is"
        if folder and _inside(Path(source), Path(output)):
            return Path(source), "holds"
    return None


def check_apart(
    output: str | Path, inputs: Iterable[str | Path | None], flag: str = "--output", folder: bool = False
) -> None:
    """Refuse an ``output`` (a file, or a ``folder`` the command replaces) that would land on what the command reads
    (``clash``) or on the standard input (a pipe or a file the shell gave: ``--output /dev/stdin``), naming both."""
    if (found := clash(output, [*inputs, STDIN], folder)) is not None:
        source, how = found
        what = "the same file as" if how == "is" else "a folder holding"
        raise OutputError(
            f"{flag} '{output}' is {what} '{source}', which this command reads; write the output elsewhere"
        )
