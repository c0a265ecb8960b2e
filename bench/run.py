"""The benchmark suite: tfm against its peers, measured side by side in one run; prints a table, writes JSON.

Sections (all by default, or pick with --sections):
  train    training throughput, tfm vs a same-shape MarianMTModel (bench.train_speed), small and base
           shapes, fp32 and bf16 autocast (where the CPU multiplies bf16 in hardware), MFU against matmul
           peaks measured in this run; each system in a process of its own (--same-process: both in this one)
  decode   tfm vs transformers' generate vs CTranslate2 on tfm's weights (bench.decode_speed)
  int8     tfm's int8 decoding vs CTranslate2's int8 on the same grid, and tfm's test BLEU in fp32 and int8
  startup  wall-clock and CPU seconds of `tfm --help` and `tfm translate "..."` (bench.startup)
  memory   peak RSS of `tfm translate` on 1,000 test lines, and on 10,000 streamed lines
  levers   each speed-up measured alone, without and with it (bench.levers)
  contended  the process-wide levers again while 3 other torch processes keep the CPU busy
  compile  torch.compile against eager training (not in the default: compiling takes minutes)
  ensemble  the ensemble of --checkpoint and each --member against each of them alone, at greedy and beam 5,
           batches of 32 and 1, all in this process: its seconds per sentence against the sum of the members'
           (not in the default: it needs the members)
  student  a distilled --student against --checkpoint, the model it replaces, in tfm and CTranslate2, fp32 and
           int8, with each one's memory and size on disk (bench.student; not in the default: it needs the student)
Decoding, start-up, memory and levers need a trained model: pass --checkpoint, or a small one is trained
first for --train-minutes. train and compile alone need only its tokenizer, trained in seconds when not given.
--quick: fewer rounds, the small shape only, 3,000 lines for the memory test, a 3-minute model.

Run: python -m bench.run [--quick] [--checkpoint DIR] [--data DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import decode_speed, levers, startup, student, train_speed
from bench.common import DEFAULT_DATA, ROOT, machine, shape_config
from bench.summary import TARGETS, table
from transformer import checkpoint
from transformer.config import DataConfig
from transformer.runtime.precision import cpu_multiplies_bf16
from transformer.text.corpus import load_split
from transformer.text.tokenizer import Tokenizer, train_tokenizer
from transformer.training.mfu import matmul_peak

MODEL_SECTIONS = {"decode", "int8", "startup", "memory", "levers", "contended"}


def train_checkpoint(data: str, runs: Path, minutes: float) -> Path:
    """Train configs/small.yaml on Multi30k for ``minutes`` (validation only at the end); return its best."""
    name = "bench-small"
    sets = [
        f"data.path={data}",
        f"run_dir={runs}",
        f"name={name}",
        f"train.max_minutes={minutes}",
        "train.eval_every=1000000000",
        "train.save_every=1000000000",
    ]
    args = [*startup.tfm_command(), "train", "--config", str(ROOT / "configs" / "small.yaml"), "--overwrite", "--quiet"]
    print(f"training a small model for {minutes:g} min: {' '.join(args)} --set {' --set '.join(sets)}", flush=True)
    subprocess.run([*args, *[x for s in sets for x in ("--set", s)]], cwd=ROOT, check=True)
    return runs / name / "best"


def small_tokenizer(data: str) -> Tokenizer:
    """configs/small.yaml's BPE trained on Multi30k's train split: all that the train and compile sections need."""
    cfg = shape_config("small", data)
    return train_tokenizer(cfg.tokenizer, load_split(cfg.data, cfg.data.train_split))


def run_train(args: argparse.Namespace, tok, peaks: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for shape in ("small",) if args.quick else ("small", "base"):
        cfg = shape_config(shape, args.data)
        batches = train_speed.bench_batches(cfg, tok, 8, str(args.runs / ".cache"))
        rounds = (4 if args.quick else 16) if shape == "small" else (2 if args.quick else 8)
        for precision in ("fp32", "bf16") if cpu_multiplies_bf16() else ("fp32",):  # bf16 emulated: not a row
            dtype = torch.float32 if precision == "fp32" else torch.bfloat16
            peaks[precision] = max(peaks.get(precision, 0.0), matmul_peak(dtype))  # the best seen in the run
            out = train_speed.measure(cfg, tok, batches, precision, rounds, 2, apart=not args.same_process)
            row = {
                "shape": shape,
                "precision": precision,
                "processes": "one" if args.same_process else "own",
                "ratio_vs_marian": out["ratio"],
                **{f"{name}_{k}": v for name in ("tfm", "marian") for k, v in vars(out[name]).items()},
            }
            rows.append(row)
            print(
                f"train {shape} {precision}: tfm {row['tfm_tgt_tok_s']:,.0f} tgt tok/s, Marian "
                f"{row['marian_tgt_tok_s']:,.0f}, ratio {row['ratio_vs_marian']:.2f}",
                flush=True,
            )
    for r in rows:
        peak = max(peaks[r["precision"]], matmul_peak(torch.float32 if r["precision"] == "fp32" else torch.bfloat16))
        peaks[r["precision"]] = peak
    for r in rows:
        for name in ("tfm", "marian"):
            r[f"{name}_mfu"] = r[f"{name}_gflops"] / peaks[r["precision"]]
    for shape in {r["shape"] for r in rows if r["precision"] == "bf16"}:
        fp32, bf16 = (next(r for r in rows if r["shape"] == shape and r["precision"] == p) for p in ("fp32", "bf16"))
        bf16["bf16_vs_fp32"] = bf16["tfm_tgt_tok_s"] / fp32["tfm_tgt_tok_s"]
    return rows


def decode_grid(args: argparse.Namespace, loaded, lines: list[str], refs: list[str], systems) -> list[dict[str, Any]]:
    """Each system's speed and BLEU at greedy and beam 5, batch 32 and batch 1."""
    rows = []
    for beam in (1, 5):
        for batch in (32, 1):
            per_round = 1 if batch == 32 else 4
            rounds = (6 if args.quick else 40) if batch == 32 else (4 if args.quick else 25)
            out = decode_speed.measure(
                systems,
                lines,
                refs,
                loaded.tokenizer,
                loaded.cfg.data.tgt_lang,
                decode_speed.Setting(beam, batch),
                rounds,
                per_round,
            )
            rows.append({"beam": beam, "batch": batch, **out})
            print(
                f"decode beam {beam} batch {batch}: "
                + ", ".join(f"{k} {v['sentences_per_s']:.1f} sent/s BLEU {v['bleu']:.2f}" for k, v in out.items()),
                flush=True,
            )
    return rows


def run_decode(args: argparse.Namespace, loaded, lines: list[str], refs: list[str]) -> list[dict[str, Any]]:
    alpha, apart = loaded.cfg.decode.alpha, not args.same_process
    with decode_speed.own_processes(loaded, decode_speed.PEERS, "fp32", alpha, args.runs, apart) as systems:
        rows = decode_grid(args, loaded, lines, refs, systems)
    same = decode_speed.agreement(loaded, lines, refs, args.runs, apart)
    rows.append({"agreement_alpha0": same})
    print(f"beam 5 without length normalisation: {same}", flush=True)
    return rows


def run_int8(args: argparse.Namespace, loaded, lines: list[str], refs: list[str]) -> dict[str, Any]:
    alpha, apart = loaded.cfg.decode.alpha, not args.same_process
    with decode_speed.own_processes(loaded, decode_speed.INT8_PEERS, "int8", alpha, args.runs, apart) as systems:
        grid = decode_grid(args, loaded, lines, refs, systems)
    bleu = decode_speed.full_test_bleu(loaded, lines, refs, ("fp32", "int8"))
    print(f"tfm test BLEU, all {len(lines)} lines: {bleu}", flush=True)
    return {"grid": grid, "bleu_all_lines": bleu}


def run_ensemble(args: argparse.Namespace, members: list, lines: list[str], refs: list[str]) -> list[dict[str, Any]]:
    """The ensemble of ``members`` and each member alone, decoding the same batches in turn; each row adds the
    members' seconds per sentence summed over the ensemble's (at least 1: no dearer than running them one by one)."""
    systems = {"tfm": decode_speed.tfm_decoder(members)}
    systems |= {f"member {i}": decode_speed.tfm_decoder(m) for i, m in enumerate(members, 1)}
    rows = decode_grid(args, members[0], lines, refs, systems)
    for r in rows:
        alone = sum(1 / r[f"member {i}"]["sentences_per_s"] for i in range(1, len(members) + 1))
        r["members_vs_ensemble"] = alone * r["tfm"]["sentences_per_s"]
    return rows


def run_student(args: argparse.Namespace, recipe, pupil, lines: list[str], refs: list[str]) -> dict[str, Any]:
    """The student against the recipe model: the grid of every engine and precision on both (bench.student), each
    row with the student's ratios, then each model's costs over the test sources."""
    with decode_speed.in_workers(student.workers(recipe, pupil, args.runs, args.shortlist)) as systems:
        grid = decode_grid(args, recipe, lines, refs, systems)
    for r in grid:
        r["ratios"] = student.ratios(r)
    test = args.runs / "student-test.txt"
    test.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    models = {name: student.costs(m, test, args.runs / name) for name, m in zip(student.MODELS, (recipe, pupil))}
    return {"grid": grid, "models": models}


def run_startup_memory(args: argparse.Namespace, ckpt: Path, sections: set[str], test: list[str]) -> dict[str, Any]:
    """Seconds of `tfm --help` and of one `tfm translate`; peak memory of `tfm translate` over the model's test
    sources repeated to 1,000 lines and more."""
    out: dict[str, Any] = {}
    if "startup" in sections:
        out["help"] = startup.help_seconds(5)
        out["help_imports_torch"] = startup.help_imports_torch()
        out["translate"] = startup.translate_seconds(ckpt, 3)
        print(f"startup: tfm --help {out['help']}, translate {out['translate']}", flush=True)
    if "memory" in sections:
        for n in (1000, 3000 if args.quick else 10000):
            path = args.runs / f"lines{n}.txt"
            path.write_text("\n".join((test * (n // len(test) + 1))[:n]) + "\n", encoding="utf-8")
            out[f"rss_{n}"] = startup.translate_memory(ckpt, path, [])
            print(f"memory {n} lines: {out[f'rss_{n}']}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, small shape only")
    parser.add_argument("--checkpoint", type=Path, help="a trained small checkpoint for decoding")
    parser.add_argument(
        "--train-minutes",
        type=float,
        default=None,
        help="when no --checkpoint is given (default 20, or 3 with --quick)",
    )
    parser.add_argument(
        "--member", type=Path, action="append", default=[], help="ensemble section: a model decoding with --checkpoint"
    )
    parser.add_argument("--student", type=Path, help="student section: a distilled model replacing --checkpoint")
    parser.add_argument("--shortlist", type=Path, help="student section: the student's tfm shortlist, timed as well")
    parser.add_argument("--data", default=DEFAULT_DATA, help="Multi30k folder")
    parser.add_argument("--lines", type=int, default=None, help="decode the first N test lines only (default: all)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench", help="scratch folder")
    parser.add_argument("--json", type=Path, help="where to write the results (default: <runs>/results.json)")
    parser.add_argument("--sections", default="train,decode,int8,startup,memory,levers,contended")
    parser.add_argument(
        "--same-process",
        action="store_true",
        help="train, decode and int8 sections: every system in this one process, not each in its own",
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    args.runs.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    minutes = args.train_minutes if args.train_minutes is not None else (3.0 if args.quick else 20.0)
    ckpt = args.checkpoint
    if ckpt is None and sections & MODEL_SECTIONS:
        ckpt = train_checkpoint(args.data, args.runs, minutes)
    loaded = checkpoint.load(ckpt) if ckpt else None
    tok = loaded.tokenizer if loaded else small_tokenizer(args.data)
    pair = {"src_lang": loaded.cfg.data.src_lang, "tgt_lang": loaded.cfg.data.tgt_lang} if loaded else {}
    test = load_split(DataConfig(format="multi30k", path=args.data, **pair), "test_2016_flickr")  # the model's pair
    lines, refs = list(test.src)[: args.lines], list(test.tgt)[: args.lines]
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "targets": TARGETS,
        "checkpoint": str(ckpt) if ckpt else None,
        "checkpoint_step": loaded.meta.get("step") if loaded else None,
        "processes": "one" if args.same_process else "own",  # of the train, decode and int8 sections' systems
        "peaks_gflops": {},
    }
    if "train" in sections:
        result["train"] = run_train(args, tok, result["peaks_gflops"])
    if "decode" in sections:
        result["decode"] = run_decode(args, loaded, lines, refs)
    if "int8" in sections:
        result["int8"] = run_int8(args, loaded, lines, refs)
    if sections & {"startup", "memory"}:
        result["startup_memory"] = run_startup_memory(args, ckpt, sections, list(test.src))
    if "levers" in sections:
        result["levers"] = levers.measure(loaded, args.data, lines, args.quick, str(args.runs / ".cache"))
    if "contended" in sections:
        result.setdefault("levers", []).extend(levers.omp_waiting(str(ckpt), args.data, 2 if args.quick else 4, 3))
    if "ensemble" in sections:
        if not args.member:
            parser.error("the ensemble section needs --checkpoint and at least one --member")
        members = [loaded] + [checkpoint.load(m) for m in args.member]
        result["ensemble_members"] = [str(m.path) for m in members]
        result["ensemble"] = run_ensemble(args, members, lines, refs)
    if "student" in sections:
        if not (args.checkpoint and args.student):
            parser.error("the student section needs --checkpoint (the model it replaces) and --student")
        result["student"] = run_student(args, loaded, checkpoint.load(args.student), lines, refs)
    if "compile" in sections:
        cfg = shape_config("small", args.data)
        batches = train_speed.bench_batches(cfg, tok, 8, str(args.runs / ".cache"))
        result.setdefault("levers", []).append(levers.compiled(cfg, tok, batches, 4 if args.quick else 8))
    result["machine_after"] = machine()
    result["minutes"] = (time.perf_counter() - start) / 60
    out = args.json or args.runs / "results.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\n{result['machine']}\n" + table(result) + f"\n\nJSON: {out} ({result['minutes']:.0f} min)")


if __name__ == "__main__":
    main()
