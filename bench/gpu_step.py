"""The paper's base model on one GPU, in one call: how soon training is under way, the training update with each
lever alone and all together against the levers off and Marian, MFU, a profile, and decoding against `generate`.

Sections, each written to the JSON as soon as it is done (in this order by default; --sections picks):
  start    ``tfm train --config base-gpu`` twice, each in a process of its own: with an empty inductor cache (a fresh
           TORCHINDUCTOR_CACHE_DIR) and again with the cache the first run filled. Seconds from the process's start
           to the end of its first update (log.jsonl's start record) and the set-up before it; target tokens/s and
           MFU logged after update 50; the validation at the end. The first run's best/ is what ``decode`` translates.
  levers   target tokens/s of the Trainer's own update (transformer.training.update.Updater) with each lever that
           compiles nothing, alone and together, against the levers off and a same-shape MarianMTModel (where
           transformers is installed); MFU of each; and the host's waits inside one update (CUDA's sync debug mode)
  compile  the same for the levers that compile: the layers, the loss over the vocabulary, both, all levers together
  decode   test_2016_flickr through tfm's Translator (what ``tfm translate`` runs) against ``generate`` of the
           checkpoint's Hugging Face export (``tfm export --format hf``) and, where it runs on this device,
           CTranslate2: greedy and beam 5, batches of 1 and 64 sentences; sentences/s, BLEU, and the share of
           output lines identical to tfm's; and, in one batch of 64, how often the host waited for the device against
           the search's steps and its reads of the device (host.to_host: once a step, twice when hypotheses end)
  profile  updates of --profile's systems under torch.profiler: wall and GPU busy time per update, kernels per
           update, GPU time by kernel family and the top kernels
  whole    all levers with each layer kind compiled once (train.compile) against the same with the whole model
           compiled (train.compile before regional compilation): throughput, and the seconds their first updates took

Training systems run blocks of consecutive updates as the Trainer runs them (each update queued, the one before it
booked then; the block ends when its last update is done), their batches collated and pinned beforehand (the
Trainer collates ahead in a thread); the systems alternate block by block, each block the same 8 updates' batches.

Run: python -m bench.gpu_step [--data DIR] [--json PATH] [--sections start,levers,...] [--steps 600]
     python -m bench.gpu_step --device cpu --quick     (checks that it runs, without a GPU)
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch

from bench import train_speed
from bench.common import DEFAULT_DATA, ROOT, host_waits, interleave, machine, median, paired_ratio, run_sections
from bench.gpu_decode import decode_grid
from bench.gpu_profile import profile
from bench.marian_peer import build_marian
from transformer.config import Config
from transformer.config_file import load
from transformer.model.transformer import Transformer
from transformer.runtime.precision import PRECISIONS, training_precision
from transformer.text.batching import EncodedCorpus, encode_corpus, make_batches
from transformer.text.corpus import load_split
from transformer.text.tokenizer import Tokenizer, train_tokenizer
from transformer.training import mfu, update
from transformer.training.schedule import make_optimizer
from transformer.training.update import Levers, UpdateBatches, Updater, collate_update

LEVERS_OFF = {"static_shapes": False, "cuda_graphs": False, "compile": False, "prefetch": 0}
GRAPHS = {"static_shapes": True, "cuda_graphs": True}
ALL = {**GRAPHS, "compile": True}
# name -> (the train settings it changes from LEVERS_OFF, its Levers, the whole model compiled instead of its layers)
SYSTEMS: dict[str, tuple[dict[str, Any], Levers, bool]] = {
    "levers off": ({}, Levers(), False),
    "static shapes": ({"static_shapes": True}, Levers(), False),
    "cuda graphs, micro-steps only": (GRAPHS, Levers(tail_graph=False), False),
    "cuda graphs": (GRAPHS, Levers(), False),
    "compiled layers": ({"compile": True}, Levers(compiled_loss=False), False),
    "compiled loss": ({"compile": True}, Levers(compiled_layers=False), False),
    "compiled layers and loss": ({"compile": True}, Levers(), False),
    "all levers": (ALL, Levers(), False),
    "all levers, whole model compiled": (ALL, Levers(compiled_layers=False), True),
}
SECTIONS = {  # the systems each training section alternates, besides "levers off" and Marian
    "levers": ["static shapes", "cuda graphs, micro-steps only", "cuda graphs", "all levers"],
    "compile": ["compiled layers", "compiled loss", "compiled layers and loss", "all levers"],
    "whole": ["all levers", "all levers, whole model compiled"],
}
BLOCK = 8  # updates in a timed block: the cycle of distinct updates' batches
QUICK = [
    "model.N=1",
    "model.d_model=64",
    "model.d_ff=128",
    "model.h=2",
    "tokenizer.vocab_size=1000",
    "train.batch_tokens=2000",
    "train.eval_sentences=8",
    "decode.max_len_b=5",
]


class Runner(Protocol):
    """A way of training that runs updates ``first + 1 .. first + count`` and returns when the device is done."""

    def run(self, first: int, count: int) -> None: ...


def config(data: str, overrides: list[str]) -> Config:
    """configs/base-gpu.yaml on Multi30k ``data``, then ``overrides``, with the levers off."""
    cfg = load(ROOT / "configs" / "base-gpu.yaml", [f"data.path={data}", *overrides])
    return replace(cfg, train=replace(cfg.train, **LEVERS_OFF))


class System:
    """One way of training: a fresh base model (the same initial weights for every system), Adam, an Updater with
    ``levers``, and the cycle of updates collated and pinned once."""

    def __init__(
        self,
        cfg: Config,
        tok: Tokenizer,
        data: EncodedCorpus,
        updates: list[list[list[int]]],
        device: torch.device,
        levers: Levers = Levers(),
        whole_model: bool = False,
    ) -> None:
        self.device = device
        torch.manual_seed(cfg.seed)
        model = Transformer(cfg.model, tok.vocab_size, tok.pad_id).to(device).train()
        self.cfg = replace(cfg, precision=training_precision(cfg.precision, device))
        opt = make_optimizer(model, cfg.train, device)
        scaler = torch.amp.GradScaler(device.type, enabled=PRECISIONS[self.cfg.precision].loss_scaling)
        self.updater = Updater(self.cfg, device, model, model, opt, scaler, levers)
        if whole_model:  # what train.compile was before it compiled one layer of each kind
            self.updater.forward = torch.compile(model, backend=update.COMPILE_BACKEND)
        pin = device.type == "cuda"
        self.works = [collate_update(u, data, tok, self.cfg, pin=pin) for u in updates]

    def run(self, first: int, count: int) -> None:
        """Updates ``first + 1 .. first + count`` as the Trainer runs them: each queued, the one before it booked
        then; returns once the last is done."""
        queued = None
        for r in range(first, first + count):
            after = self.updater(self.works[r % len(self.works)], r + 1)
            if queued is not None:
                queued.result()
            queued = after
        if queued is not None:
            queued.result()

    def host_waits(self, r: int) -> int | None:
        """How often the host waited for the device while update r was queued (None on a CPU)."""
        queued: list[Any] = []
        waits = host_waits(lambda: queued.append(self.updater(self.works[r % len(self.works)], r + 1)), self.device)
        queued[0].result()
        return waits


class Marian:
    """MarianMTModel of the same shape on the levers-off batches: its logits, ``F.cross_entropy``, the same update."""

    def __init__(self, cfg: Config, tok: Tokenizer, works: list[UpdateBatches], device: torch.device) -> None:
        torch.manual_seed(cfg.seed)
        peer = build_marian(cfg.model, tok).to(device).train()
        opt = train_speed.optimizer(peer, cfg, device=device)  # Adam as the Trainer makes it (fused on CUDA)
        batches = [w.batches[0][0].to(device) for w in works]
        precision = training_precision(cfg.precision, device)
        self.step = train_speed.marian_step(peer, opt, batches, precision, cfg, tok.pad_id, device, sync=False)
        self.device = device

    def run(self, first: int, count: int) -> None:
        for r in range(first, first + count):
            self.step(r)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def measure(
    systems: dict[str, Runner], works: list[UpdateBatches], warmup: int, rounds: int, peak: float | None
) -> dict[str, Any]:
    """Systems alternated block by block over ``warmup`` updates and then ``rounds`` blocks of ``len(works)``
    updates: target tokens/s (median over blocks), MFU, ratios to the levers off and to Marian."""
    started = {}
    for name, system in systems.items():  # the first updates (eager runs, captures, compilation), timed apart
        began = time.perf_counter()
        system.run(0, warmup)
        started[name] = time.perf_counter() - began
    block = len(works)
    times = interleave(
        {n: (lambda s: lambda r: s.run(warmup + r * block, block))(s) for n, s in systems.items()}, rounds
    )
    tokens = sum(w.total for w in works)
    flops = sum(w.flops for w in works)
    rows = {}
    for name, ts in times.items():
        rows[name] = {
            "tgt_tok_s": tokens / median(ts),
            "update_ms": median(ts) / block * 1e3,
            "mfu": flops / median(ts) / peak if peak else None,
            "first_updates_s": started[name],
            "first_updates": warmup,
            "vs_levers_off": paired_ratio(times["levers off"], ts),
            "vs_marian": paired_ratio(times["marian"], ts) if "marian" in times else None,
            "host_waits_in_an_update": systems[name].host_waits(warmup) if isinstance(systems[name], System) else None,
        }
    for name, row in rows.items():
        print(
            f"  {name:>34}: {row['tgt_tok_s']:>10,.0f} tgt tok/s {row['update_ms']:6.1f} ms/update "
            f"{row['vs_levers_off']:.2f}x off"
            + (f" {row['vs_marian']:.2f}x Marian" if row["vs_marian"] else "")
            + (f" MFU {row['mfu']:.1%}" if row["mfu"] else "")
            + (f" host waits {row['host_waits_in_an_update']}" if row["host_waits_in_an_update"] is not None else "")
            + f" (first {warmup} updates {row['first_updates_s']:.1f} s)",
            flush=True,
        )
    return rows


def first_updates(data: EncodedCorpus, cfg: Config, count: int) -> list[list[list[int]]]:
    """The first ``count`` updates' index lists of a shuffled epoch, as the Trainer cuts them."""
    order = make_batches(data, cfg.train.batch_tokens, cfg.seed, 0, shuffle=True, pad_multiple=cfg.train.pad_multiple)
    size = cfg.train.accumulate
    return [order[i : i + size] for i in range(0, min(len(order), count * size), size)]


def train_run(name: str, data: str, runs: Path, steps: int, sets: list[str], inductor_cache: Path) -> dict[str, Any]:
    """``tfm train --config base-gpu`` for ``steps`` updates, in a process of its own with ``inductor_cache`` as
    inductor's cache, validating once at the end; the figures of its log."""
    out = runs / name
    cmd = [sys.executable, "-m", "cli", "train", "--config", "base-gpu", "--data-dir", data, "--quiet", "--overwrite"]
    for s in (f"name={name}", f"run_dir={runs}", f"train.max_steps={steps}", f"train.eval_every={steps}", *sets):
        cmd += ["--set", s]
    cmd += ["--set", f"train.save_every={10 * steps}"]
    began = time.perf_counter()
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    if proc.returncode:
        raise RuntimeError(f"tfm train failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    start = next(e for e in log if e["kind"] == "start")
    trained = [e for e in log if e["kind"] == "train" and e["step"] > 50]
    valid = [e for e in log if e["kind"] == "valid"][-1]
    end = [e for e in log if e["kind"] == "end"][-1]
    row = {
        "command": " ".join(["tfm", *cmd[3:]]),
        "inductor_cache": str(inductor_cache),
        "first_update_s": start["first_update_s"],
        "set_up_s": start["set_up_s"],
        "peak_tflops": start.get("peak_tflops"),
        "peak_source": start.get("peak_source"),
        "tgt_tok_s_after_update_50": median([e["target_tokens_per_s"] for e in trained]) if trained else None,
        "mfu_after_update_50": median([e["mfu"] for e in trained]) if trained and "mfu" in trained[0] else None,
        "tgt_tok_s_by_window": {e["step"]: round(e["target_tokens_per_s"]) for e in log if e["kind"] == "train"},
        "valid_loss": valid["valid_loss"],
        "valid_bleu": valid["valid_bleu"],
        "train_s": end["train_s"],
        "valid_s": end["valid_s"],
        "wall_s": wall,
        "checkpoint": str(out / "best"),
    }
    print(
        f"  {name}: first update {row['first_update_s']:.1f} s after the start ({row['set_up_s']:.1f} s set-up), "
        f"{row['tgt_tok_s_after_update_50'] or 0:,.0f} tgt tok/s after update 50"
        + (f", MFU {row['mfu_after_update_50']:.1%}" if row["mfu_after_update_50"] else "")
        + f", valid loss {row['valid_loss']:.3f}, BLEU {row['valid_bleu']:.2f}, {wall:.0f} s in all",
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_step", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="Multi30k folder")
    p.add_argument("--json", type=Path, default=Path("runs/gpu_step.json"))
    p.add_argument("--runs", type=Path, default=Path("runs/gpu_step"), help="scratch folder (runs, inductor caches)")
    p.add_argument("--sections", default="start,levers,compile,decode,profile,whole", help="which, in order")
    p.add_argument("--steps", type=int, default=600, help="updates of the start section's first tfm train run")
    p.add_argument("--rounds", type=int, default=8, help="timed blocks of 8 updates per system")
    p.add_argument("--profile", default="all levers", help="the systems the profile section profiles")
    p.add_argument("--checkpoint", type=Path, help="what decode translates (default: the start section's)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to check the script without a GPU")
    p.add_argument("--quick", action="store_true", help="a tiny model and a few updates (checks that it runs)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu_step needs a CUDA GPU; pass --device cpu --quick to check the script without one")
    device = torch.device(args.device)
    shape = QUICK if args.quick else []
    base = config(args.data, shape)
    rounds, steps = (2, 4) if args.quick else (args.rounds, args.steps)
    runs = args.runs.resolve()
    cold_cache = runs / "inductor-cache"  # emptied here: the start section's first run finds nothing compiled
    shutil.rmtree(cold_cache, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cold_cache)  # this process compiles from what the start section left
    os.environ.pop("TRITON_CACHE_DIR", None)  # Triton's cache then lies in inductor's
    result: dict[str, Any] = {"machine": machine(), "command": " ".join(["python -m bench.gpu_step", *sys.argv[1:]])}
    peak = None
    if device.type == "cuda":
        result["card"] = torch.cuda.get_device_name()
        peak, result["peak_source"] = mfu.bf16_peak(device)
        result["peak_tflops"] = peak / 1e12
        measured = mfu.matmul_peak(torch.bfloat16, n=8192, repeats=10, device=device)
        result["bf16_matmul_measured_tflops"] = measured / 1e3
        print(
            f"{result['card']}: bf16 peak {peak / 1e12:,.0f} TFLOP/s ({result['peak_source']}), "
            f"measured {measured / 1e3:,.0f}",
            flush=True,
        )
    train = load_split(base.data, base.data.train_split)
    tok = train_tokenizer(base.tokenizer, train)
    data = encode_corpus(train, tok, base.data.max_len, str(runs / ".cache"))
    updates = first_updates(data, base, 2 if args.quick else BLOCK)
    warmup = 2 * len(updates) + 2  # every shape run eagerly once and captured once, then a steady update or two

    def on_device(names: list[str]) -> list[str]:
        """The systems of ``names`` that run on this device (CUDA graphs and compilation on CUDA only)."""
        return [
            n
            for n in names
            if device.type == "cuda" or not (SYSTEMS[n][0].get("cuda_graphs") or SYSTEMS[n][0].get("compile"))
        ]

    def system(name: str) -> System:
        sets, levers, whole = SYSTEMS[name]
        return System(replace(base, train=replace(base.train, **sets)), tok, data, updates, device, levers, whole)

    def training(names: list[str]) -> dict[str, Any]:
        found: dict[str, Runner] = {n: system(n) for n in ["levers off", *on_device(names)]}
        if importlib.util.find_spec("transformers"):
            found["marian"] = Marian(base, tok, found["levers off"].works, device)
        rows = measure(found, found["levers off"].works, warmup, rounds, peak)
        del found  # the systems' models, optimizers and graph pools go before the next section
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return rows

    def starts() -> dict[str, Any]:
        sets = [*shape, "train.peak_lr=0.0007", "train.warmup=200"]  # a schedule short enough that best/ translates
        if device.type != "cuda":
            sets += ["device=cpu", "train.cuda_graphs=false", "train.compile=false"]
        out = {"cold": train_run("cold", args.data, runs, steps, sets, cold_cache)}
        out["warm"] = train_run("warm", args.data, runs, 2 if args.quick else 100, sets, cold_cache)
        return out

    def profiles() -> dict[str, Any]:
        out = {}
        for name in on_device(args.profile.split(",")) or ["levers off"]:
            s = system(name)
            s.run(0, warmup)
            print(f"profile, {name}:", flush=True)
            out[name] = profile(s, warmup, 3)
        return out

    sections = {
        "start": starts,
        "levers": lambda: training(SECTIONS["levers"]),
        "compile": lambda: training(SECTIONS["compile"]),
        "decode": lambda: decode_grid(args.checkpoint or runs / "cold" / "best", args.data, device, args.quick),
        "profile": profiles,
        "whole": lambda: training(SECTIONS["whole"]),
    }
    run_sections(sections, args.sections.split(","), result, args.json)


if __name__ == "__main__":
    main()
