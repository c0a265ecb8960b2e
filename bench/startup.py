"""Start-up and memory of the ``tfm`` command itself, run as a user runs it (a fresh process each time).

``tfm --help`` must not import torch; ``tfm translate "..."`` is timed wall-clock from process
start to exit. Memory is read from /proc while translating: VmHWM, the kernel's high-water mark of
the resident set (not ``wait4``'s ru_maxrss, which counts this big benchmark process the child was
forked from, nor samples taken before the child's exec), and VmRSS, so that growth over a long,
streamed input shows up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, median

SENTENCE = "Ein Mann fährt Fahrrad."


def tfm_command() -> list[str]:
    """The installed ``tfm`` script next to this Python, else ``python -m cli``."""
    script = Path(sys.executable).parent / "tfm"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cli"]


def _timed(args: list[str]) -> tuple[float, float]:
    """(wall-clock, CPU seconds of the process) of one run; CPU time barely depends on the machine's load."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(args)} failed")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def _medians(runs: list[tuple[float, float]]) -> dict[str, float]:
    return {"wall_s": median([w for w, _ in runs]), "cpu_s": median([c for _, c in runs])}


def help_seconds(repeats: int) -> dict[str, float]:
    """Median wall-clock and CPU seconds of ``tfm --help``."""
    return _medians([_timed([*tfm_command(), "--help"]) for _ in range(repeats)])


def help_imports_torch() -> bool:
    """Whether importing the CLI and building its help pulls in torch."""
    code = (
        "import sys; from typer.testing import CliRunner; from cli.main import app; "
        "CliRunner().invoke(app, ['--help']); print(int('torch' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return out.stdout.strip() == "1"


def translate_seconds(checkpoint: Path, repeats: int) -> dict[str, float]:
    """Median wall-clock and CPU seconds of ``tfm translate SENTENCE --checkpoint DIR`` (default beam)."""
    args = [*tfm_command(), "translate", SENTENCE, "--checkpoint", str(checkpoint), "--device", "cpu"]
    return _medians([_timed(args) for _ in range(repeats)])


def _memory_mb(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of a running process in MB, or None once it is gone or before it has become ``tfm``.

    Between fork and exec the child is a copy of this benchmark process (gigabytes, with the peers
    loaded): those samples would be the parent's, so they are skipped until the command line is tfm's.
    """
    try:
        if b"translate" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None


def translate_memory(checkpoint: Path, lines: Path, extra: list[str], every: float = 0.25) -> dict[str, float]:
    """Peak RSS (MB) of ``tfm translate --input lines``; RSS samples compared between the run's two halves."""
    args = [
        *tfm_command(),
        "translate",
        "--input",
        str(lines),
        "--output",
        os.devnull,
        "--checkpoint",
        str(checkpoint),
        "--device",
        "cpu",
        *extra,
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples: list[float] = []
    peak = 0.0
    while True:
        pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if (memory := _memory_mb(proc.pid)) is not None:
            samples.append(memory[0])
            peak = max(peak, memory[1])
        time.sleep(every)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)} exited with {proc.returncode}")
    half = max(len(samples) // 2, 1)
    return {
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": peak,
        "rss_first_half_max_mb": max(samples[:half], default=0.0),
        "rss_second_half_max_mb": max(samples[half:], default=0.0),
    }
