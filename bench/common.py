"""What every benchmark here shares: interleaved timing, medians, the machine's description, Multi30k.

Timings on a shared machine swing by tens of percent, so tfm and its peer run in alternation
(tfm, peer, peer, tfm, ...: the order flips each round so neither always runs first) and each is
summarised by its median; the ratio of two systems is the median of the per-round ratios.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from transformer.config import Config
from transformer.config_file import load
from transformer.runtime.process import OMP_KEYS, SHARED_CPU

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = os.environ.get("TFM_MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k"))
PEERS = ("transformers", "ctranslate2")
MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what decides fp32 and bf16 matmul speed


def interleave(systems: dict[str, Callable[[int], float | None]], rounds: int) -> dict[str, list[float]]:
    """Run ``systems[name](round)`` for each round, alternating the order; returns each one's seconds per round.

    A system may return its own measured seconds (to leave set-up out), or None to be timed whole.
    """
    names = list(systems)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            took = systems[name](r)
            times[name].append(took if took is not None else time.perf_counter() - start)
    return times


@contextmanager
def workers(commands: dict[str, list[str]]) -> Iterator[dict[str, Callable[[str], str]]]:
    """``python -m <command>`` per name, each started and waited for until it prints "ready"; yields for each a
    call that sends one line and returns the worker's one-line answer. The workers end when their stdin closes."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for name, args in commands.items()
    }
    try:
        for w in procs.values():
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError(f"bench worker {w.args} did not start (its error is above)")

        def ask(w: subprocess.Popen) -> Callable[[str], str]:
            def send(line: str) -> str:
                w.stdin.write(line + "\n")
                w.stdin.flush()
                if not (answer := w.stdout.readline()):
                    raise RuntimeError(f"bench worker {w.args} stopped at {line[:40]!r} (its error is above)")
                return answer

            return send

        yield {name: ask(w) for name, w in procs.items()}
    finally:
        for w in procs.values():
            w.stdin.close()
            w.wait()


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired_ratio(slow: list[float], fast: list[float]) -> float:
    """Median over rounds of slow[i] / fast[i]: how many times faster ``fast`` was, round by round."""
    return statistics.median(s / f for s, f in zip(slow, fast))


def page_fault_us(mb: int = 256) -> float:
    """Wall microseconds per page fault while first touching ``mb`` MB of fresh memory.

    Marian's training step makes its logits whole (over 100 MB at the small shape) and glibc maps
    blocks that large afresh for every step, so its speed here moves with this figure.
    """
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    torch.empty(mb * 2**18).fill_(1.0)
    took = time.perf_counter() - start
    return took / max(1, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * 1e6


def _peer_versions() -> dict[str, str | None]:
    """The installed peers' versions, from package metadata (nothing imported): their speed moves with releases."""
    found: dict[str, str | None] = {}
    for name in PEERS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def machine() -> dict[str, object]:
    """The hardware and software every figure depends on.

    ``cpu_flags`` names the matmul units a CPU model name hides.
    """
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_flags": [f for f in MATMUL_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        **_peer_versions(),
        "python": platform.python_version(),
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "page_fault_us": round(page_fault_us(), 2),
        **{k.lower(): os.environ.get(k) for k in (*OMP_KEYS, SHARED_CPU)},
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def shape_config(shape: str, data: str) -> Config:
    """configs/<shape>.yaml with the Multi30k folder ``data``."""
    return load(ROOT / "configs" / f"{shape}.yaml", [f"data.path={data}"])


def run_sections(sections: dict[str, Callable[[], Any]], names: list[str], result: dict[str, Any], path: Path) -> None:
    """Run the named sections in order into ``result``, written to ``path`` after each one: a failing section
    is recorded as its error and must not lose the others' figures."""
    for name in names:
        print(f"== {name}", flush=True)
        try:
            result[name] = sections[name]()
        except Exception as e:
            result[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def host_waits(work: Callable[[], object], device: torch.device) -> int | None:
    """How often the host waited for the device while ``work`` ran (CUDA's sync debug mode; None on a CPU)."""
    if device.type != "cuda":
        work()
        return None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)
