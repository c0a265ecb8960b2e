"""Verdicts measured once on this machine and kept between runs: which precision trains or decodes faster here.

They live in ``$XDG_CACHE_HOME/tfm/cpu-precision.json`` (default ``~/.cache``), keyed by what decides them: the
processor, torch's thread count and version, and the model's shape. Delete the file to measure again.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from transformer.files import atomic_file

Name = TypeVar("Name")
Result = TypeVar("Result")


def cache_path() -> Path:
    """Where verdicts are kept, one per machine and shape."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfm" / "cpu-precision.json"


def processor() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """This machine as a verdict's key begins: processor, thread count, torch version."""
    return f"{processor()} | {torch.get_num_threads()} threads | torch {torch.__version__}"


def shape(N: int, d_model: int, d_ff: int, h: int, vocabulary: int) -> str:
    """A model's shape as a verdict's key ends."""
    return f"N {N}, d_model {d_model}, d_ff {d_ff}, h {h}, vocabulary {vocabulary}"


def alternated(names: Sequence[Name], run: Callable[[Name], Result], rounds: int) -> dict[Name, list[Result]]:
    """``run(name)`` for every name once untimed (first runs pick kernels and allocate), then ``rounds`` times each,
    the order reversed every other round so that no name gains from its place."""
    for name in names:
        run(name)
    results: dict[Name, list[Result]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            results[name].append(run(name))
    return results


def _read() -> dict:
    try:
        cache = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def recall(key: str) -> dict | None:
    """The verdict kept under ``key``, if there is one."""
    verdict = _read().get(key)
    return verdict if isinstance(verdict, dict) else None


def remember(key: str, verdict: dict) -> None:
    """Keep ``verdict`` under ``key``, beside the others; an unwritable cache only means measuring again."""
    cache = _read()
    cache[key] = verdict
    try:
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(cache_path()) as f:
            f.write(json.dumps(cache, indent=2) + "\n")
    except OSError:
        pass
