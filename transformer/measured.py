"""What ``precision: auto`` becomes on a CPU where no rule decides (transformer.runtime.precision has the rules).

Whether bf16 (or, for decoding, int8) beats fp32 depends on the processor's matrix instructions, how fast it reads
memory and the model's shape. So the model's shape runs the work in each candidate (a training step; encoding and
greedy steps for one sentence and for eight), alternated round by round, and a precision below fp32 is chosen only
when it beats fp32 by ``MARGIN`` (it changes the model's numbers, so a near tie goes to fp32). The verdict is kept per
machine and shape, in ``$XDG_CACHE_HOME/tfm/cpu-precision.json`` (default ``~/.cache``), keyed by what decides it: the
processor, torch's thread count and version, and the model's shape. Delete the file to measure again.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F

from transformer.config import ModelConfig
from transformer.model.decoding_copy import decoding_model
from transformer.model.transformer import Transformer
from transformer.runtime.precision import AUTO, autocast, by_rule
from transformer.storage.files import atomic_file

MARGIN = 1.15
ROUNDS = 3


def measured_training(model: ModelConfig, vocab_size: int, log: Callable[[str], None]) -> str:
    """fp32 or bf16, whichever trains ``model``'s shape faster on this CPU: kept, else measured and kept."""
    layers = model.N if model.depths == (model.N, model.N) else "{}+{}".format(*model.depths)
    key = f"{machine()} | {shape(layers, model.d_model, model.d_ff, model.h, vocab_size)}"
    return _verdict(key, ("fp32", "bf16"), lambda: training_seconds(model, vocab_size), "train", log)


def decoding_precision(name: str, model: Transformer, device: torch.device, log: Callable[[str], None]) -> str:
    """What decoding in ``name`` runs in: other names as they are; auto by the rule, on a CPU what decodes
    ``model``'s shape fastest here among fp32, bf16 and int8 (kept, else measured and kept)."""
    if name != AUTO:
        return name
    if (rule := by_rule(device)) is not None:
        return rule
    layer = model.decoder.layers[0]
    dims = (layer.self_attn.h * layer.self_attn.d_k, layer.ff.w_1.out_features, layer.self_attn.h)
    depths = len(model.encoder.layers), len(model.decoder.layers)
    layers = depths[0] if depths[0] == depths[1] else "{}+{}".format(*depths)
    key = f"decoding | {machine()} | {shape(layers, *dims, model.generator.out_features)}"
    names = ("fp32", "bf16", "int8")
    return _verdict(key, names, lambda: decoding_seconds(model, names), "decode", log)


def _verdict(
    key: str, names: tuple[str, ...], measure: Callable[[], dict[str, dict]], verb: str, log: Callable[[str], None]
) -> str:
    """The precision kept under ``key`` if there is one among ``names``, else measured, chosen and kept."""
    kept = recall(key)
    if kept is not None and kept.get("precision") in names:
        return kept["precision"]
    seconds = measure()
    speed = speedups(seconds)
    precision = choose(speed)
    others = " and ".join(f"{name} at {speed[name]:.2f}x" for name in names if name != "fp32")
    kept = remember(key, {"precision": precision, **{f"{name}_s": seconds[name] for name in names}})
    where = f"kept in {cache_path()}" if kept else f"could not keep it in {cache_path()}: measured again next time"
    log(f"precision auto: against fp32, {others} {verb} on this CPU, so {precision} ({where})")
    return precision


def speedups(seconds: dict[str, dict]) -> dict[str, float]:
    """Each precision's speed over fp32's: the geometric mean over the workloads timed."""
    fp32 = seconds["fp32"]
    return {
        name: math.exp(statistics.fmean(math.log(fp32[w] / s) for w, s in by_work.items()))
        for name, by_work in seconds.items()
    }


def choose(speed: dict[str, float]) -> str:
    """The fastest precision if it beats fp32 by the margin, else fp32."""
    best = max(speed, key=speed.__getitem__)
    return best if speed[best] >= MARGIN else "fp32"


def training_seconds(
    model: ModelConfig, vocab_size: int, rounds: int = ROUNDS, clock: Callable[[], float] = time.perf_counter
) -> dict[str, dict]:
    """Median seconds of a training step (forward, loss, backward) of a ``model``-shaped Transformer on one batch of
    16 x 64 tokens a side, in fp32 and in bf16."""
    torch.manual_seed(0)
    net = Transformer(model, vocab_size, 0)
    src, tgt = torch.randint(1, vocab_size, (2, 16, 64))
    cpu = torch.device("cpu")

    def step(precision: str) -> dict[str, float]:
        start = clock()
        with autocast(precision, cpu):
            logits = net(src, tgt)
        F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten()).backward()
        return {"step": clock() - start}

    times = alternated(("fp32", "bf16"), step, rounds)
    return {name: {"step": statistics.median(r["step"] for r in runs)} for name, runs in times.items()}


def decoding_seconds(
    model: Transformer,
    names: tuple[str, ...],
    rounds: int = ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
    length: int = 12,
    steps: int = 8,
) -> dict[str, dict]:
    """Median seconds per precision of encoding ``length`` tokens then ``steps`` steps, for one sentence (as a
    sentence or the server decodes it) and for eight (as a file is decoded)."""
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    vocab = model.generator.out_features
    src = {n: torch.randint(4, vocab, (n, length), generator=generator) for n in (1, 8)}
    tokens = torch.randint(4, vocab, (steps, 8), generator=generator)
    models = {name: decoding_model(model, name, cpu) for name in names}

    def decode(name: str) -> dict[int, float]:
        m, seconds = models[name], {}
        for n, x in src.items():
            start = clock()
            with torch.inference_mode(), autocast(name, cpu):
                state = m.start_state(*m.encode(x))
                for t in range(steps):
                    m.decode_step(tokens[t, :n], state)
            seconds[n] = clock() - start
        return seconds

    times = alternated(names, decode, rounds)
    return {name: {n: statistics.median(r[n] for r in runs) for n in src} for name, runs in times.items()}


# ----- verdicts kept between runs, per machine and shape ---------------------------------------------------------

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


def shape(N: int | str, d_model: int, d_ff: int, h: int, vocabulary: int) -> str:
    """A model's shape as a verdict's key ends (N: its layers, or "encoder+decoder" where they differ)."""
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


def remember(key: str, verdict: dict) -> bool:
    """Keep ``verdict`` under ``key``, beside the others; whether it was kept (an unwritable cache only means
    measuring again)."""
    cache = _read()
    cache[key] = verdict
    try:
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(cache_path()) as f:
            f.write(json.dumps(cache, indent=2) + "\n")
    except OSError:
        return False
    return True
