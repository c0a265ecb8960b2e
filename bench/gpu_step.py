"""The paper's base model training on one GPU, measured in one call: a profile of the update, each training lever
alone and all together against the update as the Trainer runs it by default (Marian in the same run), then
``tfm train --config base-gpu`` with the levers off and on.

Sections, each written to the JSON as soon as it is done:
  profile  base bf16 updates of 25,000 tokens under torch.profiler, for the systems --profile names: wall time,
           GPU busy time, kernel launches per update, GPU time by kernel family and the top kernels
  levers   target tokens/s of the Trainer's own update (transformer.training.update.Updater, collation included)
           with the --levers that compile nothing (static shapes, CUDA graphs), against the levers off and
           MarianMTModel (where transformers is installed), alternated update by update
  compile  the same for the --levers with train.compile, with the seconds the first updates took (compilation)
  train    ``tfm train --config base-gpu`` for ``--steps`` updates on Multi30k, with the levers the config ships and
           with them all off: logged target tokens/s after the first 50 updates, validation loss at the end

Run: python -m bench.gpu_step [--data DIR] [--json PATH] [--sections profile,levers,train,compile] [--steps 300]
     python -m bench.gpu_step --device cpu --quick     (checks that it runs, without a GPU)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.common import DEFAULT_DATA, ROOT, interleave, machine, median, paired_ratio, run_sections
from transformer.config import Config, load
from transformer.device import PRECISIONS, resolve_precision
from transformer.model.transformer import build_model
from transformer.text.batching import EncodedCorpus, encode_corpus, make_batches
from transformer.text.corpus import load_split
from transformer.text.tokenizer import Tokenizer, train_tokenizer
from transformer.training.mfu import matmul_peak
from transformer.training.schedule import make_optimizer
from transformer.training.update import UpdateBatches, Updater, collate_update

LEVERS_OFF = {"static_shapes": False, "cuda_graphs": False, "compile": False, "prefetch": 0}
SYSTEMS = {  # name -> the train settings it changes from LEVERS_OFF
    "default": {},
    "static shapes": {"static_shapes": True},
    "cuda graphs": {"static_shapes": True, "cuda_graphs": True},
    "compile": {"compile": True},
    "compile + cuda graphs": {"static_shapes": True, "cuda_graphs": True, "compile": True},
}
FAMILIES = [  # kernel name pattern -> family, first match wins
    ("triton (compiled)", r"triton"),
    ("matmul", r"gemm|nvjet|xmma|cutlass|cublas|s\d+816|wgmma"),
    ("attention", r"fmha|flash|attention|attn"),
    ("optimizer", r"adam|multi_tensor|foreach|norm_kernel_cuda|lpnorm"),
    ("layer norm", r"layer_norm|layernorm"),
    ("dropout", r"dropout|bernoulli|philox"),
    ("softmax / loss", r"softmax|logsumexp|nll|cross_entropy|scatter|gather"),
    ("reduction", r"reduce"),
    ("copy / cast / fill", r"copy|cast|convert|fill|memset|memcpy|index"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
]


QUICK = ["model.N=1", "model.d_model=64", "model.d_ff=128", "model.h=2", "train.batch_tokens=2000"]


def config(data: str, overrides: list[str]) -> Config:
    """configs/base-gpu.yaml on Multi30k ``data``, then ``overrides``, with the levers off."""
    cfg = load(ROOT / "configs" / "base-gpu.yaml", [f"data.path={data}", *overrides])
    return replace(cfg, train=replace(cfg.train, **LEVERS_OFF))


class System:
    """One way of training: a fresh base model (the same initial weights for every system), Adam, and an Updater."""

    def __init__(
        self, cfg: Config, tok: Tokenizer, data: EncodedCorpus, updates: list[list[list[int]]], device: torch.device
    ) -> None:
        self.device = device
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, tok.vocab_size, tok.pad_id).to(device).train()
        precision = resolve_precision(cfg.precision, device)
        self.cfg = replace(cfg, precision=precision)
        opt = make_optimizer(model, cfg.train, device)
        scaler = torch.amp.GradScaler(device.type, enabled=PRECISIONS[precision].loss_scaling)
        self.updater = Updater(self.cfg, device, model, model, opt, scaler)
        self.data, self.tok, self.updates = data, tok, updates

    def work(self, r: int) -> UpdateBatches:
        """The r-th update's batches (cycling), collated and pinned as the Trainer does."""
        return collate_update(
            self.updates[r % len(self.updates)], self.data, self.tok, self.cfg, pin=self.device.type == "cuda"
        )

    def __call__(self, r: int) -> None:
        """Update r over the r-th update's batches (cycling), collated here as the Trainer collates them."""
        self.updater(self.work(r), r + 1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _tokens(data: EncodedCorpus, update: list[list[int]]) -> int:
    return sum(int(data.tgt_lengths[i].sum()) + len(i) for i in update)


def measure(
    systems: dict[str, Callable[[int], None]],
    data: EncodedCorpus,
    updates: list[list[list[int]]],
    warmup: int,
    rounds: int,
) -> dict[str, Any]:
    """Systems alternated over ``warmup + rounds`` updates; target tokens/s (median) and ratios to the default."""
    started = {}
    for name, step in systems.items():  # the first updates (eager runs, captures, compilation), timed apart
        began = time.perf_counter()
        for r in range(warmup):
            step(r)
        started[name] = time.perf_counter() - began
    times = interleave({n: (lambda s: lambda r: s(r + warmup))(s) for n, s in systems.items()}, rounds)
    tokens = [_tokens(data, updates[(r + warmup) % len(updates)]) for r in range(rounds)]
    rows = {}
    for name, ts in times.items():
        rows[name] = {
            "tgt_tok_s": median([n / t for n, t in zip(tokens, ts)]),
            "update_s": median(ts),
            "first_updates_s": started[name],
            "first_updates": warmup,
        }
    for name in rows:
        rows[name]["vs_default"] = paired_ratio(times["default"], times[name]) if "default" in times else None
        rows[name]["vs_marian"] = paired_ratio(times["marian"], times[name]) if "marian" in times else None
    for name, row in rows.items():
        print(
            f"  {name:>24}: {row['tgt_tok_s']:>10,.0f} tgt tok/s  {row['update_s'] * 1e3:7.1f} ms/update  "
            + (f"{row['vs_default']:.2f}x default  " if row["vs_default"] else "")
            + (f"{row['vs_marian']:.2f}x Marian" if row["vs_marian"] else "")
            + f"  (first {warmup} updates {row['first_updates_s']:.1f} s)",
            flush=True,
        )
    return rows


def first_updates(data: EncodedCorpus, cfg: Config, count: int) -> list[list[list[int]]]:
    """The first ``count`` updates' index lists of a shuffled epoch, as the Trainer cuts them."""
    order = make_batches(data, cfg.train.batch_tokens, cfg.seed, 0, shuffle=True, pad_multiple=cfg.train.pad_multiple)
    size = cfg.train.accumulate
    return [order[i : i + size] for i in range(0, min(len(order), count * size), size)]


def family(name: str) -> str:
    for fam, pattern in FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return fam
    return "other"


def profile(system: System, start: int, updates: int) -> dict[str, Any]:
    """One system's updates ``start..start+updates-1`` under torch.profiler: per-update wall and GPU busy time,
    kernel launches, GPU time by kernel family (CPU only: operator time, no kernels)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = system.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        began = time.perf_counter()
        for r in range(start, start + updates):
            system(r)
        wall = (time.perf_counter() - began) / updates
    kernels: Counter = Counter()
    by_family: Counter = Counter()
    count = 0
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time if hasattr(e, "device_time") else e.cuda_time
            kernels[e.name] += us
            by_family[family(e.name)] += us
            count += 1
    busy = sum(by_family.values()) / 1e6 / updates
    out = {
        "wall_s_per_update": wall,
        "gpu_busy_s_per_update": busy if cuda else None,
        "gpu_busy_share": busy / wall if cuda else None,
        "kernels_per_update": count / updates if cuda else None,
        "gpu_s_per_update_by_family": {k: v / 1e6 / updates for k, v in by_family.most_common()},
        "top_kernels_s_per_update": {k[:120]: v / 1e6 / updates for k, v in kernels.most_common(12)},
    }
    if not cuda:
        ops = prof.key_averages()
        out["top_ops_cpu_s_per_update"] = {
            o.key: o.self_cpu_time_total / 1e6 / updates for o in sorted(ops, key=lambda o: -o.self_cpu_time_total)[:12]
        }
    print(
        f"  wall {wall * 1e3:.1f} ms/update"
        + (f", GPU busy {busy * 1e3:.1f} ms ({busy / wall:.0%}), {count / updates:.0f} kernels/update" if cuda else ""),
        flush=True,
    )
    for k, v in list(out["gpu_s_per_update_by_family"].items())[:8]:
        print(f"    {k:>20}: {v * 1e3:6.2f} ms", flush=True)
    return out


def train_run(name: str, data: str, runs: Path, steps: int, device: str, sets: list[str]) -> dict[str, Any]:
    """``tfm train --config base-gpu`` for ``steps`` updates, validating once at the end; its log's figures."""
    out = runs / name
    cmd = [
        sys.executable,
        "-m",
        "cli",
        "train",
        "--config",
        "base-gpu",
        "--data-dir",
        data,
        "--quiet",
        "--overwrite",
        "--set",
        f"name={name}",
        "--set",
        f"run_dir={runs}",
        "--set",
        f"device={device}",
        "--set",
        f"train.max_steps={steps}",
        "--set",
        f"train.eval_every={steps}",
        "--set",
        f"train.save_every={10 * steps}",
        *[a for s in sets for a in ("--set", s)],
    ]
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode:
        raise RuntimeError(f"tfm train failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    trained = [e for e in log if e["kind"] == "train" and e["step"] > 50]
    valid = [e for e in log if e["kind"] == "valid"][-1]
    end = [e for e in log if e["kind"] == "end"][-1]
    row = {
        "command": " ".join(["tfm", *cmd[3:]]),
        "wall_s": wall,
        "tgt_tok_s_after_update_50": median([e["target_tokens_per_s"] for e in trained]) if trained else None,
        "tgt_tok_s_by_window": {e["step"]: round(e["target_tokens_per_s"]) for e in log if e["kind"] == "train"},
        "valid_loss": valid["valid_loss"],
        "valid_bleu": valid["valid_bleu"],
        "train_s": end["train_s"],
        "valid_s": end["valid_s"],
        "save_s": end["save_s"],
    }
    print(
        f"  {name}: {row['tgt_tok_s_after_update_50'] or 0:,.0f} tgt tok/s after update 50, valid loss "
        f"{row['valid_loss']:.4f}, BLEU {row['valid_bleu']:.2f}, {wall:.0f} s in all",
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_step", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="Multi30k folder")
    p.add_argument("--json", type=Path, default=Path("runs/gpu_step.json"))
    p.add_argument("--runs", type=Path, default=Path("runs/gpu_step"), help="scratch folder for the train section")
    p.add_argument("--sections", default="profile,levers,train,compile", help="which measurements, in order")
    p.add_argument("--steps", type=int, default=300, help="updates of each tfm train run")
    p.add_argument("--rounds", type=int, default=24, help="timed updates per system in the levers sections")
    p.add_argument(
        "--levers",
        default=",".join(list(SYSTEMS)[1:]),
        help="the systems the levers (and compile) sections measure against the default and Marian",
    )
    p.add_argument("--profile", default="default,cuda graphs", help="the systems the profile section profiles")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to check the script without a GPU")
    p.add_argument("--quick", action="store_true", help="a tiny model and a few updates (checks that it runs)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu_step needs a CUDA GPU; pass --device cpu --quick to check the script without one")
    device = torch.device(args.device)
    shape = QUICK if args.quick else []
    base = config(args.data, shape)
    rounds, steps = (3, 4) if args.quick else (args.rounds, args.steps)
    result: dict[str, Any] = {"machine": machine(), "command": " ".join(["python -m bench.gpu_step", *sys.argv[1:]])}
    if device.type == "cuda":
        result["card"] = torch.cuda.get_device_name()
        result["bf16_matmul_peak_gflops"] = peak = matmul_peak(torch.bfloat16, n=8192, repeats=10, device=device)
        print(f"{result['card']}: bf16 matmul peak {peak:,.0f} GFLOP/s", flush=True)
    train = load_split(base.data, base.data.train_split)
    tok = train_tokenizer(base.tokenizer, train)
    data = encode_corpus(train, tok, base.data.max_len, str(args.runs / ".cache"))
    updates = first_updates(data, base, 2 if args.quick else 8)
    warmup = 2 * len(updates) + 2  # every shape run eagerly once and captured once, then a steady update or two

    def systems(which: dict[str, dict[str, Any]]) -> dict[str, System]:
        """The systems of ``which`` that run on this device (compile and CUDA graphs only on CUDA)."""
        runs = {
            n: t for n, t in which.items() if device.type == "cuda" or not (t.get("cuda_graphs") or t.get("compile"))
        }
        return {
            n: System(replace(base, train=replace(base.train, **t)), tok, data, updates, device)
            for n, t in runs.items()
        }

    def marian() -> Callable[[int], None]:
        from bench import train_speed  # needs transformers, the peer: only when it is installed

        batches = [
            w.batches[0][0].to(device)
            for w in (System(base, tok, data, updates, device).work(r) for r in range(len(updates)))
        ]
        return train_speed.build("marian", base, tok, batches, resolve_precision(base.precision, device), device)

    def levers(names: list[str]) -> dict[str, Any]:
        found: dict[str, Callable[[int], None]] = {"default": System(base, tok, data, updates, device)}
        found |= systems({n: SYSTEMS[n] for n in names if n != "default"})
        if importlib.util.find_spec("transformers"):
            found["marian"] = marian()
        return measure(found, data, updates, warmup, rounds)

    def profiles() -> dict[str, Any]:
        out = {}
        for name, system in systems({n: SYSTEMS[n] for n in args.profile.split(",")}).items():
            for r in range(warmup):
                system(r)
            print(f"profile, {name}:", flush=True)
            out[name] = profile(system, warmup, 3)
        return out

    def trains() -> dict[str, Any]:
        off = [f"train.{k}={json.dumps(v)}" for k, v in LEVERS_OFF.items()]
        extra = shape + ["train.eval_sentences=16"] * args.quick
        if device.type != "cuda":
            extra += ["train.cuda_graphs=false", "train.compile=false"]
        out = {}
        for label, name, sets in (
            ("levers off", "levers-off", off + extra),
            ("levers on (as configs/base-gpu.yaml)", "levers-on", extra),
        ):
            try:  # one failing run must not lose the other's figures
                out[label] = train_run(name, args.data, args.runs, steps, args.device, sets)
            except RuntimeError as e:
                out[label] = {"error": str(e)}
                print(f"  {name}: failed: {e}", flush=True)
        return out

    chosen = [n for n in args.levers.split(",") if n]
    sections = {
        "profile": profiles,
        "levers": lambda: levers([n for n in chosen if "compile" not in n]),
        "compile": lambda: levers([n for n in chosen if "compile" in n]),
        "train": trains,
    }
    run_sections(sections, args.sections.split(","), result, args.json)


if __name__ == "__main__":
    main()
