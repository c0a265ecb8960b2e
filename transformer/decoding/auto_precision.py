"""``--precision auto`` for decoding: the precision that decodes this model fastest on this device.

On a GPU, training's rule (bf16 where it has bf16 tensor cores, else fp16). On a CPU no flag decides it: which of
fp32, bf16 and int8 is fastest depends on the processor's matrix instructions, how fast it reads memory, and the
model's shape. So the model decodes the same synthetic sources in each (encoding, then ``STEPS`` greedy steps, for
one sentence and for a batch), alternated round by round; a precision below fp32 is chosen only when it beats fp32
by ``MARGIN`` over both (it changes the model's numbers, so a near tie goes to fp32). The verdict is kept per
machine and shape (transformer.measured).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from transformer.decoding.int8 import INT8
from transformer.decoding.precision import decoding_autocast, decoding_model
from transformer.device import resolve_precision
from transformer.measured import alternated, cache_path, machine, recall, remember, shape
from transformer.model.transformer import Transformer

MARGIN = 1.15
ROUNDS = 3
SENTENCES = (1, 8)  # one sentence, as `tfm translate "..."` and the server decode it; a batch, as a file is decoded
SOURCE_LENGTH, STEPS = 12, 8


def candidates() -> tuple[str, ...]:
    """fp32 and bf16, and int8 where this torch has a quantized engine."""
    return ("fp32", "bf16") + ((INT8,) if torch.backends.quantized.engine != "none" else ())


def model_shape(model: Transformer) -> str:
    """The model's shape as a verdict's key ends (transformer.measured.shape)."""
    layer = model.decoder.layers[0]
    return shape(
        len(model.decoder.layers),
        model.src_embed.embedding_dim,
        layer.ff.w_1.out_features,
        layer.self_attn.h,
        model.generator.out_features,
    )


def measure(
    model: Transformer, names: tuple[str, ...], rounds: int = ROUNDS, clock: Callable[[], float] = time.perf_counter
) -> dict[str, dict[int, float]]:
    """Median seconds per precision and number of sentences: encoding SOURCE_LENGTH tokens, then STEPS steps."""
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    vocab = model.generator.out_features
    src = {n: torch.randint(4, vocab, (n, SOURCE_LENGTH), generator=generator) for n in SENTENCES}
    tokens = torch.randint(4, vocab, (STEPS, max(SENTENCES)), generator=generator)
    models = {name: decoding_model(model, name, cpu) for name in names}

    def decode(name: str, n: int) -> float:
        m = models[name]
        start = clock()
        with torch.inference_mode(), decoding_autocast(name, cpu):
            state = m.start_state(*m.encode(src[n]))
            for t in range(STEPS):
                m.decode_step(tokens[t, :n], state)
        return clock() - start

    times = alternated(names, lambda name: {n: decode(name, n) for n in SENTENCES}, rounds)
    return {name: {n: statistics.median(r[n] for r in runs) for n in SENTENCES} for name, runs in times.items()}


def speedups(seconds: dict[str, dict[int, float]]) -> dict[str, float]:
    """Each precision's speed over fp32's: the geometric mean over the numbers of sentences."""
    fp32 = seconds["fp32"]
    return {
        name: math.exp(statistics.fmean(math.log(fp32[n] / s) for n, s in by_n.items()))
        for name, by_n in seconds.items()
    }


def choose(seconds: dict[str, dict[int, float]]) -> str:
    """The fastest precision if it beats fp32 by the margin, else fp32."""
    speed = speedups(seconds)
    best = max(speed, key=speed.__getitem__)
    return best if speed[best] >= MARGIN else "fp32"


def decoding_precision(model: Transformer, device: torch.device, log: Callable[[str], None] = lambda msg: None) -> str:
    """What ``auto`` decodes ``model`` in on ``device``: training's rule on a GPU; on a CPU cached, else measured
    and cached; fp32 elsewhere."""
    if device.type != "cpu":
        return resolve_precision("auto", device)
    key = f"decoding | {machine()} | {model_shape(model)}"
    kept = recall(key)
    names = candidates()
    if kept is not None and kept.get("precision") in names:
        return kept["precision"]
    seconds = measure(model, names)
    precision = choose(seconds)
    speed = speedups(seconds)
    others = " and ".join(f"{name} at {speed[name]:.2f}x" for name in names if name != "fp32")
    log(f"precision auto: against fp32, {others} decode on this CPU, so {precision} (kept in {cache_path()})")
    remember(key, {"precision": precision, **{f"{name}_s": seconds[name] for name in names}})
    return precision
