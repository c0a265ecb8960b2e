"""Precisions, in one place: their names, what each needs, the autocast each runs under, the model as each decodes,
and what ``auto`` becomes.

fp32, bf16 and fp16 train and decode (bf16 and fp16 under autocast; fp16 on a CUDA GPU only, with loss scaling).
int8 decodes only, on a CPU: a copy of the model whose Linear layers hold int8 weights (model.linears.Int8Linear),
fp32 in and out. On a CPU every precision decodes a copy with modules swapped in for decoding steps
(``decoding_model``); the step is always the model's own.

``auto`` is resolved before anything runs. On a GPU a rule decides (bf16 from compute capability 8.0, fp16 before);
a CPU with AMX tiles trains in bf16. On other CPUs no flag decides it: whether bf16 (or, for decoding, int8) beats
fp32 depends on the processor's matrix instructions, how fast it reads memory and the model's shape. So the model's
shape runs the work in each candidate (a training step; encoding and greedy steps for one sentence and for eight),
alternated round by round, and a precision below fp32 is chosen only when it beats fp32 by ``MARGIN`` (it changes
the model's numbers, so a near tie goes to fp32). The verdict is kept per machine and shape, in
``$XDG_CACHE_HOME/tfm/cpu-precision.json`` (default ``~/.cache``), keyed by what decides it: the processor, torch's
thread count and version, and the model's shape. Delete the file to measure again.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from transformer.config import ModelConfig
from transformer.errors import ConfigError
from transformer.files import atomic_file
from transformer.model.cross_fold import FoldedCrossAttention
from transformer.model.linears import Int8Linear, LinearParts, swap_linears
from transformer.model.speed import called_directly
from transformer.model.transformer import Transformer, build_model


@dataclass(frozen=True)
class Precision:
    """A precision's name, the dtype its matmuls run in, whether it trains, and whether its loss needs scaling."""

    name: str
    dtype: torch.dtype
    trains: bool = True
    loss_scaling: bool = False

    @property
    def mixed(self) -> bool:
        """Whether matmuls run below fp32, under autocast (int8's Linear layers take and give fp32)."""
        return self.dtype != torch.float32


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32),
        Precision("bf16", torch.bfloat16),
        Precision("fp16", torch.float16, loss_scaling=True),
        Precision("int8", torch.float32, trains=False),
    )
}
AUTO = "auto"
MARGIN = 1.15
ROUNDS = 3


def check_precision(name: str, device: torch.device, training: bool) -> None:
    """A precision that ``device`` can train (or decode) in, or auto; else a one-line error naming the fix."""
    names = [n for n, p in PRECISIONS.items() if p.trains or not training] + [AUTO]
    if name not in names:
        raise ConfigError(f"precision '{name}' is not one of {', '.join(names)}; pick one of them")
    if name == AUTO:
        return
    if PRECISIONS[name].loss_scaling and device.type != "cuda":
        raise ConfigError(
            f"precision: fp16 needs a CUDA GPU but the device is {device.type}; use precision: bf16 or fp32"
        )
    if not PRECISIONS[name].trains:
        if device.type != "cpu":
            raise ConfigError(f"precision int8 decodes on the CPU only, the device is {device.type}; use --device cpu")
        if torch.backends.quantized.engine == "none":
            raise ConfigError("precision int8: this torch build has no quantized engine (FBGEMM/QNNPACK); use fp32")


def autocast(name: str, device: torch.device) -> ContextManager:
    """The autocast ``name`` runs under: none for fp32 and int8."""
    p = PRECISIONS[name]
    return torch.autocast(device_type=device.type, dtype=p.dtype) if p.mixed else contextlib.nullcontext()


def decoding_model(
    model: Transformer, name: str, device: torch.device, fold: bool = True, direct: bool = True
) -> Transformer:
    """``model`` as it decodes in precision ``name`` on ``device``, in eval mode: itself in fp32 off the CPU, else a
    copy with modules swapped in, sharing what it does not change (``model`` itself is left as it is).

    bf16, fp16: the Linear weights cast once (autocast caches no casts under inference mode, so each step would cast
    every weight again; cast ahead, autocast rounds the same weights the same way), the output table a copy of its
    own so that embeddings stay fp32. int8: every Linear layer in int8. fp32 on a CPU: the model's own layers, in a
    copy of the decoder (its parameters shared). On a CPU, fp32 and int8 fold encoder-decoder attention into its float
    projections for batches of few sentences (model.cross_fold; ``fold=False``: not, for bench.levers to measure what
    it gains). A copy's own modules are called directly (model.speed.called_directly; ``direct=False``: not,
    likewise).
    """
    p = PRECISIONS[name]
    if p.mixed:
        half = copy.deepcopy(model).eval().requires_grad_(False)
        half.generator.weight = nn.Parameter(half.generator.weight.detach().to(p.dtype), requires_grad=False)
        swap_linears(half, lambda parent, linear: linear.to(p.dtype))
        if direct:
            called_directly(half)
        return half
    if device.type != "cpu":
        return model.eval()
    if p.trains:  # fp32: the decoder is the copy's own, for the fold to swap into; all else shared
        fast = copy.copy(model.eval())
        fast._modules = dict(model._modules)
        fast.decoder = copy.deepcopy(model.decoder, memo={id(t): t for t in model.decoder.parameters()})
    else:
        fast = copy.deepcopy(model).eval().requires_grad_(False)
        for layer in fast.decoder.layers:  # encoder-decoder attention applies its queries and its keys and values apart
            cross = layer.cross_attn
            cross.in_proj = LinearParts(cross.in_proj, (cross.query_rows, cross.key_value_rows), Int8Linear)
        swap_linears(fast, lambda parent, linear: Int8Linear(linear.weight, linear.bias))
    if fold:
        for layer, source in zip(fast.decoder.layers, model.decoder.layers):
            layer.cross_attn = FoldedCrossAttention(layer.cross_attn, source.cross_attn)
    if direct:
        called_directly(fast, shared=tuple(model.children()))
    return fast


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles, the matrix units that multiply bf16 (torch's own check of the CPU flags)."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private; older torch builds lack it
    return bool(supported and supported())


def _by_rule(device: torch.device) -> str | None:
    """auto where a rule decides: a GPU by its tensor cores, fp32 off the CPU; None on a CPU."""
    if device.type == "cuda":
        return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    return None if device.type == "cpu" else "fp32"


def training_precision(name: str, device: torch.device, measured: Callable[[], str] | None = None) -> str:
    """What training in ``name`` runs in: other names as they are; auto by the rule, bf16 on a CPU with AMX, else
    what ``measured`` finds (``measured_training``; fp32 without it)."""
    if name != AUTO:
        return name
    rule = _by_rule(device) or ("bf16" if cpu_has_amx() else None)
    return rule or (measured() if measured is not None else "fp32")


def measured_training(model: ModelConfig, vocab_size: int, log: Callable[[str], None]) -> str:
    """fp32 or bf16, whichever trains ``model``'s shape faster on this CPU: kept, else measured and kept."""
    key = f"{machine()} | {shape(model.N, model.d_model, model.d_ff, model.h, vocab_size)}"
    return _verdict(key, ("fp32", "bf16"), lambda: training_seconds(model, vocab_size), "train", log)


def decoding_precision(name: str, model: Transformer, device: torch.device, log: Callable[[str], None]) -> str:
    """What decoding in ``name`` runs in: other names as they are; auto by the rule, on a CPU what decodes
    ``model``'s shape fastest here among fp32, bf16 and int8 (kept, else measured and kept)."""
    if name != AUTO:
        return name
    if (rule := _by_rule(device)) is not None:
        return rule
    layer = model.decoder.layers[0]
    dims = (layer.self_attn.h * layer.self_attn.d_k, layer.ff.w_1.out_features, layer.self_attn.h)
    key = f"decoding | {machine()} | {shape(len(model.decoder.layers), *dims, model.generator.out_features)}"
    names = ("fp32", "bf16") + (("int8",) if torch.backends.quantized.engine != "none" else ())
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
    log(f"precision auto: against fp32, {others} {verb} on this CPU, so {precision} (kept in {cache_path()})")
    remember(key, {"precision": precision, **{f"{name}_s": seconds[name] for name in names}})
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
    net = build_model(model, vocab_size, pad_id=0)
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
