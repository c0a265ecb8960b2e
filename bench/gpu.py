"""GPU figures in one run: the card's matmul peaks, base-shape training tokens/s and MFU (tfm vs Marian),
padding to multiples of 8, the fused loss, cuDNN and flash attention in training, decoding speed (tfm vs
transformers' generate), torch.compile.

Every system runs on the same GPU in the same process, in alternation (bench.common). Training
steps are those of bench.train_speed, each ending with a synchronize; MFU is model FLOPs per
second (transformer.training.mfu) over the bf16 (or fp32) matmul peak measured here on 8192 x 8192 operands.

Run: python -m bench.gpu --checkpoint runs/bench_small/best [--data DIR] [--json PATH] [--sections train,decode]
"""

from __future__ import annotations

import argparse
import gzip
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import decode_speed, train_speed
from bench.common import DEFAULT_DATA, interleave, machine, median, paired_ratio, run_sections, shape_config
from bench.levers import lever_row, without_with
from transformer import checkpoint
from transformer.text.batching import Batch, EncodedCorpus, collate, encode_corpus, make_batches
from transformer.text.corpus import load_split
from transformer.text.tokenizer import Tokenizer, train_tokenizer
from transformer.training.mfu import matmul_peak, train_flops

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def peaks(device: torch.device) -> dict[str, float]:
    """GFLOP/s of a square matmul (8192 on a GPU) in each precision (fp32 as torch runs it by default: no TF32)."""
    n = 8192 if device.type == "cuda" else 2048
    return {p: matmul_peak(dt, n=n, repeats=10, device=device) for p, dt in DTYPES.items()}


def _collated(
    data: EncodedCorpus, tok: Tokenizer, order: list[list[int]], pad_multiple: int, device: torch.device, count: int = 8
) -> list[Batch]:
    """The first ``count`` batches of ``order``, collated and on ``device``."""
    return [collate(data, idx, tok, pad_multiple).to(device) for idx in order[:count]]


def _first_batches(
    cfg, data: EncodedCorpus, tok: Tokenizer, batch_tokens: int, pad_multiple: int, device: torch.device, count: int = 8
) -> list[Batch]:
    """The first ``count`` batches of a shuffled epoch of ``batch_tokens``-token batches padded to ``pad_multiple``."""
    order = make_batches(data, batch_tokens, cfg.seed, 0, shuffle=True, pad_multiple=pad_multiple)
    return _collated(data, tok, order, pad_multiple, device, count)


def _tfm_step(
    cfg,
    tok: Tokenizer,
    device: torch.device,
    batches: list[Batch],
    fused_loss: bool = True,
    wrap: Callable[[nn.Module], nn.Module] = lambda m: m,
    kernels: str = "trainer",
) -> Callable[[int], None]:
    """tfm's bf16 training step on a fresh model (the same initial weights every time), run through ``wrap``,
    with SDPA's kernels chosen as ``train_speed.KERNELS[kernels]``."""
    model = train_speed.model_factory(cfg, tok)().to(device)
    return train_speed.tfm_step(
        wrap(model),
        train_speed.optimizer(model, cfg, device=device),
        batches,
        "bf16",
        cfg,
        fused_loss=fused_loss,
        device=device,
        kernels=kernels,
    )


def train_rows(
    cfg, tok: Tokenizer, data: EncodedCorpus, device: torch.device, peak: dict[str, float], rounds: int
) -> list[dict[str, Any]]:
    """tfm vs Marian for the config's model in bf16 and fp32, at the config's 4,096-token batches and at the paper's
    25,000-token update; then tfm's bf16 speed over its fp32 speed at each (a quotient of the two medians)."""
    rows = []
    for batch_tokens, precisions in ((4096, ("bf16", "fp32")), (25000, ("bf16", "fp32"))):
        batches = _first_batches(cfg, data, tok, batch_tokens, 8, device)
        for precision in precisions:
            out = train_speed.measure(cfg, tok, batches, precision, rounds, min(4, rounds), device)
            row = {
                "batch_tokens": batch_tokens,
                "precision": precision,
                "ratio_vs_marian": out["ratio"],
                **{f"{n}_{k}": v for n in ("tfm", "marian") for k, v in vars(out[n]).items()},
            }
            for n in ("tfm", "marian"):
                row[f"{n}_mfu"] = row[f"{n}_gflops"] / peak[precision]
            rows.append(row)
            print(
                f"train {cfg.name} {precision} {batch_tokens} tok/batch: tfm {row['tfm_tgt_tok_s']:,.0f} tgt tok/s "
                f"(MFU {row['tfm_mfu']:.1%}), Marian {row['marian_tgt_tok_s']:,.0f} (MFU {row['marian_mfu']:.1%}), "
                f"ratio {out['ratio']:.2f}",
                flush=True,
            )
        tfm = {r["precision"]: r["tfm_tgt_tok_s"] for r in rows if r["batch_tokens"] == batch_tokens}
        print(f"tfm bf16 vs fp32 at {batch_tokens:,} tok/batch: {tfm['bf16'] / tfm['fp32']:.2f}x", flush=True)
    return rows


def padding_row(cfg, tok: Tokenizer, data: EncodedCorpus, device: torch.device, rounds: int) -> dict[str, Any]:
    """The same 4,096-token batches padded to the longest sentence and to a multiple of 8, bf16, alternated."""
    order = make_batches(data, 4096, cfg.seed, 0, shuffle=True)
    steps = [_tfm_step(cfg, tok, device, _collated(data, tok, order, multiple, device)) for multiple in (1, 8)]
    row = lever_row("padding to multiples of 8", "bf16, 4,096 tok/batch", without_with(*steps, rounds, min(4, rounds)))
    print(f"padding to multiples of 8 (bf16, 4,096 tok/batch): {row['speedup']:.2f}x", flush=True)
    return row


def loss_row(cfg, tok: Tokenizer, data: EncodedCorpus, device: torch.device, rounds: int) -> dict[str, Any]:
    """The fused generator loss against logits made whole then scored, bf16, 25,000-token batches."""
    batches = _first_batches(cfg, data, tok, 25000, 1, device)
    steps = [_tfm_step(cfg, tok, device, batches, fused_loss=fused) for fused in (False, True)]
    row = lever_row("generator and loss fused", "bf16, 25,000 tok/batch", without_with(*steps, rounds, min(4, rounds)))
    print(f"fused generator loss vs whole logits (bf16, 25,000 tok/batch): {row['speedup']:.2f}x", flush=True)
    return row


def cudnn_rows(cfg, tok: Tokenizer, data: EncodedCorpus, device: torch.device, rounds: int) -> list[dict[str, Any]]:
    """bf16 training with SDPA's cuDNN backend left out (as the Trainer does) vs SDPA's default, which picks it on
    Hopper GPUs, on 4,096-token batches; the other kernels are allowed in both.

    cuDNN attention builds a plan for each new shape, and unpadded batches rarely repeat one: the first
    pass over 48 batches counts those builds (totals, after 4 warm-up batches), later passes do not.
    """
    batches = _first_batches(cfg, data, tok, 4096, 1, device, count=52)
    steps = {
        "without": _tfm_step(cfg, tok, device, batches, kernels="sdpa default"),
        "with": _tfm_step(cfg, tok, device, batches, kernels="flash allowed"),
    }
    interleave(steps, 4)
    first = {k: v[4:] for k, v in interleave(steps, len(batches)).items()}
    later = interleave(steps, len(batches) * max(1, rounds // 8))
    rows = [
        {
            **lever_row("cuDNN attention left out", "bf16, first pass over 48 new shapes", first),
            "total_speedup": sum(first["without"]) / sum(first["with"]),
        },
        lever_row("cuDNN attention left out", "bf16, shapes seen before", later),
    ]
    for row in rows:
        print(
            f"{row['lever']} ({row['workload']}): {row['speedup']:.2f}x per step"
            + (f", {row['total_speedup']:.2f}x in total" if "total_speedup" in row else ""),
            flush=True,
        )
    return rows


def flash_rows(cfg, tok: Tokenizer, data: EncodedCorpus, device: torch.device, rounds: int) -> list[dict[str, Any]]:
    """bf16 training with SDPA's flash kernel left out below 256 positions (as the Trainer does) vs allowed, at
    25,000- and 4,096-token batches (cuDNN left out in both)."""
    rows = []
    for batch_tokens in (25000, 4096):
        batches = _first_batches(cfg, data, tok, batch_tokens, 8, device)
        steps = [_tfm_step(cfg, tok, device, batches, kernels=k) for k in ("flash allowed", "trainer")]
        rows.append(
            lever_row(
                "flash attention left out below 256 positions",
                f"bf16, {batch_tokens:,} tok/batch",
                without_with(*steps, rounds, min(4, rounds)),
            )
        )
        print(f"{rows[-1]['lever']} ({rows[-1]['workload']}): {rows[-1]['speedup']:.2f}x", flush=True)
    return rows


def compile_row(
    cfg, tok: Tokenizer, data: EncodedCorpus, device: torch.device, peak: dict[str, float], rounds: int
) -> dict[str, Any]:
    """torch.compile (dynamic shapes) against eager, bf16, 4,096-token batches padded to multiples of 8."""
    batches = _first_batches(cfg, data, tok, 4096, 8, device)
    steps = {
        "eager": _tfm_step(cfg, tok, device, batches),
        "compiled": _tfm_step(cfg, tok, device, batches, wrap=lambda m: torch.compile(m, dynamic=True)),
    }
    first = {}
    for name, step in steps.items():
        start = time.perf_counter()
        for r in range(len(batches)):  # every shape once: compilation stays out of the timed rounds
            step(r)
        first[name] = time.perf_counter() - start
    times = interleave(steps, rounds)
    flops = median(
        [
            train_flops(cfg.model, tok.vocab_size, b.src.size(0), b.src.size(1), b.tgt_in.size(1)) / t
            for b, t in zip(batches * rounds, times["compiled"])
        ]
    )
    out = {
        "compiled_vs_eager": paired_ratio(times["eager"], times["compiled"]),
        "warmup_s": first,
        "compiled_mfu": flops / 1e9 / peak["bf16"],
    }
    print(
        f"torch.compile (bf16, 4,096 tok/batch): {out['compiled_vs_eager']:.2f}x eager, first 8 steps "
        f"{first['compiled']:.0f} s compiled vs {first['eager']:.1f} s eager",
        flush=True,
    )
    return out


def decode_rows(ckpt: Path, data: str, device: torch.device, sentences: int) -> list[dict[str, Any]]:
    """Sentences/s on test_2016_flickr: tfm fp32 and bf16 against generate fp32, all on the GPU."""
    loaded = checkpoint.load(ckpt, "cpu")
    d = loaded.cfg.data
    lines = gzip.open(Path(data) / f"test_2016_flickr.{d.src_lang}.gz", "rt", encoding="utf-8").read().splitlines()
    refs = gzip.open(Path(data) / f"test_2016_flickr.{d.tgt_lang}.gz", "rt", encoding="utf-8").read().splitlines()
    systems = {
        "tfm": decode_speed.tfm_decoder(loaded, "fp32", str(device)),
        "tfm_bf16": decode_speed.tfm_decoder(loaded, "bf16", str(device)),
        "transformers": decode_speed.marian_decoder(loaded, loaded.cfg.decode.alpha, str(device)),
    }
    rows = []
    for beam in (1, 5):
        for batch in (32, 128):
            rounds = max(1, sentences // batch // 2)
            out = decode_speed.measure(
                systems, lines, refs, loaded.tokenizer, d.tgt_lang, decode_speed.Setting(beam, batch), rounds, 2
            )
            rows.append({"beam": beam, "batch": batch, **out})
            print(
                f"decode beam {beam} batch {batch}: "
                + ", ".join(
                    f"{k} {v['sentences_per_s']:.0f} sent/s ({v['tfm_speedup']:.2f}x) BLEU {v['bleu']:.2f}"
                    for k, v in out.items()
                ),
                flush=True,
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="a trained small checkpoint for decoding")
    p.add_argument("--data", default=DEFAULT_DATA, help="Multi30k folder")
    p.add_argument("--json", type=Path, default=Path("runs/gpu.json"))
    p.add_argument(
        "--sections", default="train,padding,loss,cudnn,flash,decode,compile", help="which measurements, in order"
    )
    p.add_argument("--decode-sentences", type=int, default=1000, help="test sentences per decoding setting")
    p.add_argument("--quick", action="store_true", help="a few rounds only (checks that the script runs)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to check the script without a GPU")
    p.add_argument("--shape", default="base", help="the configs/<shape>.yaml model to train")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu needs a CUDA GPU; on the CPU run python -m bench.run, or pass --device cpu --quick")
    device = torch.device(args.device)
    rounds, sentences = (2, 128) if args.quick else (16, args.decode_sentences)
    cfg = shape_config(args.shape, args.data)
    card = torch.cuda.get_device_name() if device.type == "cuda" else machine()["cpu"]
    result: dict[str, Any] = {"machine": machine(), "card": card, "cuda": torch.version.cuda}
    result["peak_gflops"] = peak = peaks(device)
    print(f"{card}: matmul peak bf16 {peak['bf16']:,.0f} GFLOP/s, fp32 {peak['fp32']:,.0f}", flush=True)
    train = load_split(cfg.data, cfg.data.train_split)
    tok = train_tokenizer(cfg.tokenizer, train)
    data = encode_corpus(train, tok, cfg.data.max_len, str(args.json.parent / ".cache"))
    sections = {
        "train": lambda: train_rows(cfg, tok, data, device, peak, rounds),
        "padding": lambda: padding_row(cfg, tok, data, device, rounds),
        "loss": lambda: loss_row(cfg, tok, data, device, rounds),
        "cudnn": lambda: cudnn_rows(cfg, tok, data, device, rounds),
        "flash": lambda: flash_rows(cfg, tok, data, device, rounds),
        "decode": lambda: decode_rows(args.checkpoint, args.data, device, sentences),
        "compile": lambda: compile_row(cfg, tok, data, device, peak, rounds),
    }
    run_sections(sections, args.sections.split(","), result, args.json)


if __name__ == "__main__":
    main()
