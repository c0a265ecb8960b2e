"""What tfm wrote, recorded in each folder it writes, so that it deletes or replaces only its own files.

A folder tfm writes (a run, a checkpoint, an export, eval reports) holds ``.tfm-files``: its kind, each file
tfm wrote there with its size and SHA-256 (a file tfm appends to, with those of the part written when recorded),
the plain sub-folders tfm makes, and the names (patterns) of sub-folders that are units with a manifest of their
own (a run's checkpoints, a checkpoint's eval reports). A file is tfm's only if its folder's manifest names it and
its content matches; ``first_foreign`` finds the first that is not, at any depth. A folder tfm is still writing
(``.NAME.tmp-PID``) holds a manifest of kind ``partial`` from its first moment: all of it is tfm's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from transformer.errors import naming

try:
    import fcntl
except ImportError:  # Windows: no flock, so records are not locked against a second writer
    fcntl = None

MANIFEST = ".tfm-files"
PARTIAL = "partial"  # the kind of a folder tfm is still writing
LOCK = ".lock"  # a run's lock file: tfm's when empty or holding a process id
NONE: dict[str, Any] = {"kind": None, "files": {}, "folders": (), "units": ()}  # a folder without a record (read only)
TEMPORARY = re.compile(r"\.(.+)\.(tmp|old)-(\d+)")  # ``.NAME.tmp-PID``, ``.NAME.old-PID``: an atomic write's


def read(folder: Path) -> dict[str, Any] | None:
    """The manifest of ``folder``, or None where it has none (or one that is not tfm's JSON)."""
    try:
        value = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("files"), dict) or not value.get("kind"):
        return None
    return {"folders": [], "units": [], **value}


def kind(folder: Path) -> str | None:
    """The kind of folder tfm recorded ``folder`` as (run, checkpoint, average, export, eval, partial), if any."""
    manifest = read(folder)
    return manifest.get("kind") if manifest else None


def write(folder: Path, manifest: dict[str, Any]) -> None:
    """Write ``folder``'s manifest atomically (beside it first, then renamed), following the umask."""
    tmp = folder / f"{MANIFEST}.tmp-{os.getpid()}"
    try:
        with naming(folder / MANIFEST), open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
    finally:
        tmp.unlink(missing_ok=True)


def create(folder: Path, kind_: str, folders: Iterable[str] = (), units: Iterable[str] = ()) -> None:
    """Start ``folder``'s record: nothing written yet, ``folders`` the plain sub-folders tfm makes there, ``units``
    the patterns of sub-folders recorded by manifests of their own."""
    write(folder, {"kind": kind_, "files": {}, "folders": sorted(folders), "units": sorted(units)})


def describe(path: Path, grows: bool = False) -> dict[str, Any]:
    """What the record holds of one file: size, SHA-256, modification time; ``grows``: tfm appends to it later."""
    st = path.stat()
    entry = {"size": st.st_size, "sha256": _sha256(path, st.st_size), "mtime_ns": st.st_mtime_ns}
    return {**entry, "grows": True} if grows else entry


def survey(folder: Path, kind_: str, units: Iterable[str] = ()) -> dict[str, Any]:
    """The manifest of a folder whose whole content tfm has just written (every file and sub-folder under it)."""
    files, folders = {}, []
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        folders += [(here / d).relative_to(folder).as_posix() for d in dirs]
        for name in names:
            rel = (here / name).relative_to(folder).as_posix()
            if rel != MANIFEST:
                files[rel] = describe(here / name)
    return {"kind": kind_, "files": files, "folders": sorted(folders), "units": sorted(units)}


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold ``folder`` (flock on the directory itself) while its manifest is read, changed and written."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(folder: Path, *names: str, grows: bool = False, kind_: str = "files") -> None:
    """Add the files ``names`` (relative to ``folder``), as they are now, to its manifest; a folder without one gets
    one of kind ``kind_`` (a folder of the user's where tfm writes reports)."""
    with _locked(folder):
        manifest = read(folder) or {"kind": kind_, "files": {}, "folders": [], "units": []}
        for name in names:
            manifest["files"][name] = describe(folder / name, grows)
        write(folder, manifest)


def is_own(path: Path) -> bool:
    """Whether ``path`` is a file tfm wrote, as its folder's manifest records it (name and content)."""
    manifest = read(path.parent)
    return manifest is not None and _matches(path, manifest["files"].get(path.name))


def holder(path: Path) -> str | None:
    """The kind of the folder tfm wrote that the file ``path`` belongs to (a run's log, a checkpoint's weights, the
    record itself), links followed, or None: that folder needs the file as it is."""
    real = Path(os.path.realpath(path))
    manifest = read(real.parent)
    return manifest["kind"] if manifest is not None and real.name in (*manifest["files"], MANIFEST) else None


def first_foreign(folder: Path) -> Path | None:
    """The first entry under ``folder`` (in name order, at any depth) that tfm did not write, or None: a folder
    without a manifest is the user's in all it holds (an empty one holds nothing to lose)."""
    return next(foreign_entries(folder), None)


def foreign_entries(folder: Path) -> Iterator[Path]:
    """Each top-level entry of ``folder`` that is not tfm's or holds something that is not (its first such path)."""
    manifest = read(folder) or NONE
    for entry in _entries(folder):
        if (found := _judge(folder, entry, manifest)) is not None:
            yield found


def _partial(folder: Path) -> bool:
    """A folder tfm was writing when it was stopped: ``.NAME.tmp-PID`` holding a manifest."""
    return TEMPORARY.fullmatch(folder.name) is not None and read(folder) is not None


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.is_dir() and not folder.is_symlink() else []


def _judge(root: Path, entry: Path, manifest: dict[str, Any]) -> Path | None:
    """The first path at or under ``entry`` that is not tfm's, judged by ``root``'s ``manifest``."""
    rel = entry.relative_to(root).as_posix()
    if manifest["kind"] == PARTIAL:
        return None
    if entry.is_symlink():  # tfm writes no links
        return entry
    if entry.is_dir():
        if rel in manifest.get("folders", []):
            return next((f for e in _entries(entry) if (f := _judge(root, e, manifest)) is not None), None)
        if any(re.fullmatch(u, rel) for u in manifest.get("units", [])) or _partial(entry):
            return first_foreign(entry)
        return entry
    if _matches(entry, manifest["files"].get(rel)) or (manifest["kind"] and rel == MANIFEST):
        return None
    if manifest["kind"] == "run" and rel == LOCK and _is_lock(entry):
        return None
    if manifest["kind"] and TEMPORARY.fullmatch(entry.name):
        return None  # an atomic write's temporary file in a folder of tfm's, left by a kill
    return entry


def _is_lock(path: Path) -> bool:
    """A run's lock file: empty or a process id."""
    try:
        return path.stat().st_size < 32 and re.fullmatch(r"\d*\s*", path.read_text(encoding="ascii")) is not None
    except (OSError, UnicodeDecodeError):
        return False


def _matches(path: Path, entry: dict[str, Any] | None) -> bool:
    """Whether ``path`` holds what ``entry`` records (a growing file: its recorded part, then more)."""
    if entry is None:
        return False
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode):
            return False
        if st.st_size < entry["size"] or (st.st_size > entry["size"] and not entry.get("grows")):
            return False
        if st.st_size == entry["size"] and st.st_mtime_ns == entry.get("mtime_ns"):
            return True  # unchanged since recorded, as git's index judges a file
        return _sha256(path, entry["size"]) == entry["sha256"]
    except (OSError, KeyError, TypeError):
        return False


def _sha256(path: Path, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of ``path``."""
    digest, left = hashlib.sha256(), size
    with open(path, "rb") as f:
        while left > 0 and (block := f.read(min(left, 1 << 20))):
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def delete(folder: Path) -> None:
    """Delete a folder all of which is tfm's (checked by the caller), its manifest last: a deletion cut short leaves
    what remains still recorded as tfm's."""
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink(missing_ok=True)
        return
    for entry in folder.iterdir():
        if entry.name == MANIFEST:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


def discard(folder: Path) -> list[Path]:
    """Delete what tfm wrote in ``folder`` and keep the rest: the folder goes only if nothing else is in it.
    Returns the paths kept (the first foreign path of each top-level entry that holds one)."""
    kept = list(foreign_entries(folder))
    if not kept:
        delete(folder)
        return []
    manifest = read(folder) or NONE
    for entry in _entries(folder):
        if entry.name != MANIFEST and _judge(folder, entry, manifest) is None:
            delete(entry) if entry.is_dir() else entry.unlink()
    (folder / MANIFEST).unlink(missing_ok=True)  # what is left is the user's
    return kept
