"""``precision: auto`` on a CPU without AMX: whether bf16 autocast trains faster than fp32 here, measured once.

No CPU flag decides it: with AVX-512 BF16 and no AMX, bf16 trained faster than fp32 on one processor and slower on
another. So a model of the run's shape and vocabulary size runs a training step (forward, loss, backward) on one
batch in each precision, alternated round by round, and bf16 is chosen only when its median time beats fp32's by
``MARGIN`` (its rounding costs accuracy, so a near tie goes to fp32). The verdict is kept per machine and shape
(transformer.measured).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from transformer.config import ModelConfig
from transformer.device import autocast
from transformer.measured import alternated, cache_path, machine, recall, remember, shape
from transformer.model.transformer import build_model

MARGIN = 1.15
ROUNDS = 3
ROWS, LENGTH = 16, 64  # one batch of 1,024 source and 1,024 target tokens


def cache_key(model: ModelConfig, vocab_size: int) -> str:
    return f"{machine()} | {shape(model.N, model.d_model, model.d_ff, model.h, vocab_size)}"


def measure(
    model: ModelConfig, vocab_size: int, rounds: int = ROUNDS, clock: Callable[[], float] = time.perf_counter
) -> dict:
    """Median seconds of a training step of a ``model``-shaped Transformer on one batch, in fp32 and in bf16."""
    torch.manual_seed(0)
    net = build_model(model, vocab_size, pad_id=0)
    src, tgt = torch.randint(1, vocab_size, (2, ROWS, LENGTH))
    cpu = torch.device("cpu")

    def step(precision: str) -> float:
        start = clock()
        with autocast(precision, cpu):
            logits = net(src, tgt)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten()).backward()
        return clock() - start

    times = alternated(("fp32", "bf16"), step, rounds)
    return {p: statistics.median(ts) for p, ts in times.items()}


def choose(seconds: dict) -> str:
    """bf16 where it beats fp32 by the margin, else fp32."""
    return "bf16" if seconds["fp32"] >= MARGIN * seconds["bf16"] else "fp32"


def faster_cpu_precision(model: ModelConfig, vocab_size: int, log: Callable[[str], None] = lambda msg: None) -> str:
    """fp32 or bf16, whichever trains ``model``'s shape faster on this CPU: cached, else measured and cached."""
    key = cache_key(model, vocab_size)
    kept = recall(key)
    if kept is not None and kept.get("precision") in ("fp32", "bf16"):
        return kept["precision"]
    seconds = measure(model, vocab_size)
    precision = choose(seconds)
    log(
        f"precision auto: bf16 {seconds['fp32'] / seconds['bf16']:.2f}x fp32's speed on this CPU, so {precision} "
        f"(kept in {cache_path()})"
    )
    remember(key, {"precision": precision, "fp32_s": seconds["fp32"], "bf16_s": seconds["bf16"]})
    return precision
