"""A small disk that really fills: a tmpfs mounted where the tests may mount one (as root), skipped elsewhere."""

from __future__ import annotations

import subprocess
from pathlib import Path


def mount_tmpfs(folder: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` (``600k``) on the existing ``folder``; False where mounting is not allowed."""
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    )


def unmount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], check=True)


def mount_read_only(folder: Path) -> bool:
    """Mount ``folder`` read-only over itself (a bind mount, so root's writes fail too); False where not allowed."""
    bind = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if not bind:
        return False
    if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode != 0:
        unmount(folder)
        return False
    return True
