"""Training throughput: tfm against Hugging Face's MarianMTModel of the same shape, on the same batches.

One step = forward, label-smoothed loss (eps 0.1, fp32), backward, gradient clipping to norm 1,
Adam (0.9, 0.98, 1e-9) and zero_grad, in train mode with dropout 0.1. Both systems get the same
collated Multi30k batches of ~4,000 tokens and the same optimizer (fused Adam where torch has it, as
tfm's Trainer uses). The loss is each system's own: tfm's ``generator_loss`` (as its Trainer); for the peer,
PyTorch's ``F.cross_entropy(label_smoothing=0.1)``, what a transformers user writes. Steps alternate
tfm/peer; the first ``warmup`` rounds are dropped; figures are medians over the rest. bench.run runs
each system in a process of its own, as users do (``own_processes``); bench.gpu runs both in one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import interleave, median, paired_ratio, workers
from bench.marian_peer import build_marian, marian_logits
from transformer.config import Config
from transformer.model.speed import shape_changing_attention, training_attention
from transformer.model.transformer import Transformer
from transformer.runtime.precision import autocast
from transformer.text.batching import Batch, collate, encode_corpus, make_batches
from transformer.text.corpus import load_split
from transformer.text.tokenizer import Tokenizer
from transformer.training.loss import generator_loss, label_smoothed_nll
from transformer.training.mfu import train_flops
from transformer.training.schedule import make_optimizer
from transformer.training.update import UpdateBatches, Updater

CPU = torch.device("cpu")


@dataclass
class Stats:
    """Median figures of one system in one setting."""

    tgt_tok_s: float
    all_tok_s: float
    step_s: float
    gflops: float  # model FLOPs per second achieved; MFU = gflops / the matmul peak


def bench_batches(cfg: Config, tok: Tokenizer, count: int, cache: str) -> list[Batch]:
    """``count`` shuffled training batches of ``cfg.train.batch_tokens`` tokens, collated once."""
    data = encode_corpus(load_split(cfg.data, cfg.data.train_split), tok, cfg.data.max_len, cache)
    order = make_batches(data, cfg.train.batch_tokens, cfg.seed, 0, shuffle=True)
    return [collate(data, order[i], tok) for i in range(count)]


def optimizer(
    model: torch.nn.Module, cfg: Config, fused: bool | None = None, device: torch.device = CPU
) -> torch.optim.Optimizer:
    """Adam as the Trainer makes it, at a fixed lr of 1e-4 (fused where torch has it, unless ``fused`` says so)."""
    return make_optimizer(model, cfg.train, device, lr=1e-4, fused=fused)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, clip: float) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


# SDPA kernel choices for a training batch on a GPU: the Trainer's, every kernel but cuDNN, and SDPA's own default.
KERNELS: dict[str, Callable[[torch.device, Batch], AbstractContextManager]] = {
    "trainer": lambda device, b: training_attention(device, b.longest),
    "flash allowed": lambda device, b: shape_changing_attention(device),
    "sdpa default": lambda device, b: nullcontext(),
}


def tfm_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[Batch],
    precision: str,
    cfg: Config,
    fused_loss: bool = True,
    device: torch.device = CPU,
    kernels: str = "trainer",
) -> Callable[[int], None]:
    """A function running tfm's training step r on batch r (cycling through ``batches``).

    By default the step is the Trainer's own update (``transformer.training.update.Updater``, whose learning
    rate follows the schedule). The lever rows compare it with variants written out here: fused_loss=False
    makes the logits whole and scores them with ``label_smoothed_nll``; ``kernels`` picks SDPA's kernels from
    ``KERNELS`` (on a CPU all choices are the same). On a GPU the step ends with a synchronize, so that a host
    clock times the work, not its launch.
    """
    if fused_loss and kernels == "trainer":
        scaler = torch.amp.GradScaler(device.type, enabled=False)
        update = Updater(replace(cfg, precision=precision), device, model, model, opt, scaler)

        def trainer_step(r: int) -> None:
            b = batches[r % len(batches)]
            update(UpdateBatches([(b, 1.0)], b.n_tokens, 0.0), r + 1).result()
            _sync(device)

        return trainer_step
    eps, clip = cfg.train.label_smoothing, cfg.train.clip_norm
    attention = KERNELS[kernels]

    def step(r: int) -> None:
        b = batches[r % len(batches)]
        with autocast(precision, device), attention(device, b):
            if fused_loss:
                hidden = model(b.src, b.tgt_in, logits=False)
                loss, _ = generator_loss(hidden, model.generator.weight, b.tgt_out, eps, Tokenizer.PAD_ID)
            else:
                loss, _ = label_smoothed_nll(model(b.src, b.tgt_in), b.tgt_out, eps, Tokenizer.PAD_ID)
        _step(model, opt, loss / b.n_tokens, clip)
        _sync(device)

    return step


SYSTEMS = ("tfm", "marian")


def marian_step(
    peer: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[Batch],
    precision: str,
    cfg: Config,
    pad: int,
    device: torch.device = CPU,
    sync: bool = True,
) -> Callable[[int], None]:
    """A function running the peer's training step r on batch r: its logits, ``F.cross_entropy``, the same update;
    on a GPU the step ends with a synchronize unless ``sync`` is off (the caller times several steps at once)."""
    eps, clip = cfg.train.label_smoothing, cfg.train.clip_norm

    def step(r: int) -> None:
        b = batches[r % len(batches)]
        with autocast(precision, device):
            logits = marian_logits(peer, b.src, b.tgt_in, pad)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), b.tgt_out.flatten(), ignore_index=pad, label_smoothing=eps, reduction="sum"
        )
        _step(peer, opt, loss / b.n_tokens, clip)
        if sync:
            _sync(device)

    return step


def model_factory(cfg: Config, tok: Tokenizer) -> Callable[[], torch.nn.Module]:
    """Fresh tfm models of ``cfg``'s shape in train mode, all with the same initial weights."""

    def model() -> torch.nn.Module:
        torch.manual_seed(cfg.seed)
        return Transformer(cfg.model, tok.vocab_size, tok.pad_id).train()

    return model


def build(
    name: str, cfg: Config, tok: Tokenizer, batches: list[Batch], precision: str, device: torch.device = CPU
) -> Callable[[int], None]:
    """System ``name``'s training step on a fresh model (seeded with ``cfg.seed``) and its own Adam."""
    if name == "tfm":
        ours = model_factory(cfg, tok)().to(device)
        return tfm_step(ours, optimizer(ours, cfg, device=device), batches, precision, cfg, device=device)
    torch.manual_seed(cfg.seed)
    peer = build_marian(cfg.model, tok).to(device).train()
    return marian_step(peer, optimizer(peer, cfg, device=device), batches, precision, cfg, tok.pad_id, device)


@contextmanager
def own_processes(
    cfg: Config, tok: Tokenizer, batches: list[Batch], precision: str
) -> Iterator[dict[str, Callable[[int], float]]]:
    """Training steps in worker processes of their own (bench.train_worker); calls return the step's seconds.

    As users run them: each system, tfm and Marian, alone in a process.
    """
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.pt"
        torch.save({"cfg": cfg, "tok": tok, "batches": batches, "precision": precision}, spec)
        commands = {name: ["bench.train_worker", name, str(spec)] for name in SYSTEMS}
        with workers(commands) as ask:
            yield {name: (lambda r, send=send: float(send(str(r)))) for name, send in ask.items()}


def measure(
    cfg: Config,
    tok: Tokenizer,
    batches: list[Batch],
    precision: str,
    rounds: int,
    warmup: int,
    device: torch.device = CPU,
    apart: bool = False,
) -> dict[str, Stats | float]:
    """tfm and Marian steps alternated over ``batches`` (already on ``device``); per-system medians and the paired
    tfm/peer ratio. ``apart``: each system in a process of its own (``own_processes``, CPU only), else both in
    this one.
    """
    if apart:
        with own_processes(cfg, tok, batches, precision) as steps:
            times = interleave(steps, warmup + rounds)
    else:
        times = interleave(
            {name: build(name, cfg, tok, batches, precision, device) for name in SYSTEMS}, warmup + rounds
        )
    used = [batches[r % len(batches)] for r in range(warmup, warmup + rounds)]
    pad = tok.pad_id
    out: dict[str, Stats | float] = {}
    for name, ts in times.items():
        ts = ts[warmup:]
        tgt = [b.n_tokens for b in used]
        both = [b.n_tokens + int((b.src != pad).sum()) for b in used]
        flops = [train_flops(cfg.model, tok.vocab_size, b.src.size(0), b.src.size(1), b.tgt_in.size(1)) for b in used]
        out[name] = Stats(
            median([n / t for n, t in zip(tgt, ts)]),
            median([n / t for n, t in zip(both, ts)]),
            median(ts),
            median([f / t for f, t in zip(flops, ts)]) / 1e9,
        )
    out["ratio"] = paired_ratio(times["marian"][warmup:], times["tfm"][warmup:])
    return out
