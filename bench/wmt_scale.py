"""tfm's data pipeline at WMT 2014 scale on one machine: time, throughput and peak memory of each stage.

A synthetic English-German corpus the size of WMT 2014 (4.5M pairs) is written as a local copy of
the hub's ``wmt/wmt14`` dataset (``de-en/*.parquet`` plus a README declaring the ``de-en`` config),
then ``configs/wmt14-base.yaml`` runs on it, offline, stage by stage, each stage in a fresh process:

  generate       the corpus: log-normal sentence lengths (mean ~25 words, a tail past 100, clipped
                 at 250), target ~1.1 x source, words drawn from a Zipf law over made-up words
  load           ``load_split`` of train and validation (``datasets`` turns the parquet into Arrow)
  tokenizer      37,000-token joint BPE on the configured sample (``tokenizer.train_sample`` pairs)
  encode         ``encode_corpus`` of train and validation into the on-disk token cache
  encode_cached  the same again in a new process: it must read the cache, not encode
  batch          ``make_batches`` of the training pairs by ``train.batch_tokens``
  train          ``tfm train`` itself (a subprocess): its own load, tokenizer, cache, and a few updates
  resume         ``tfm train --resume`` for two more updates

Each stage reports wall seconds, pairs per second and the peak resident set of the process that
ran it (ru_maxrss, memory-mapped pages it touched included; a library stage's process first loads
what the stage needs, untimed). Library stages add their anonymous memory at the end (what the OS
cannot page out); train and resume add each update's seconds (from the run's log.jsonl) and every
line tfm logged, stamped with the second it appeared; their pairs per second is the training pairs
over the whole process, set-up included. The token cache's size is measured, and its files' names,
sizes and mtimes are compared before and after every stage after encode: one that encodes again
fails the reuse check.

    python -m bench.wmt_scale --pairs 4500000 --out /tmp/wmt_scale --json bench/results/<date>-wmt-scale.json
    python -m bench.wmt_scale --pairs 1000000 --out /tmp/wmt_scale \\
        --set model.N=1 --set model.d_model=128 --set model.d_ff=512 --set model.h=4

``--out`` is emptied first (only if this benchmark made it), so every run starts cold; the Hugging
Face cache goes there too. ``--set`` overrides apply to the train and resume stages only (on a CPU,
a smaller model keeps their updates short) and the summary records them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bench.synthetic_wmt import HELD_OUT, generate

if TYPE_CHECKING:  # the library loads in each stage's own process, so that this one stays small
    from transformer.config import Config
    from transformer.text.batching import EncodedCorpus
    from transformer.text.corpus import Corpus

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "wmt14-base.yaml"
MARKER = "wmt_scale.json"  # in --out: says this benchmark made the folder, so it may empty it
RUN_NAME = "wmt-scale"
MUST_REUSE = ("encode_cached", "batch", "train", "resume")  # stages after encode: the token cache must stay as it was
# ---- stages, each run in a fresh process -----------------------------------------------------------------


def _memory() -> dict[str, float]:
    """This process's peak resident set (ru_maxrss) and its anonymous resident memory now, in MB."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "anon_rss_mb": int(status["RssAnon"].split()[0]) / 1024,
    }


def _timed(work: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def _config(out: Path) -> Config:
    from transformer.config_file import load

    return load(CONFIG, [f"data.path={out / 'data'}", f"run_dir={out / 'runs'}", f"name={RUN_NAME}"])


def cache_dir(out: Path) -> Path:
    """Where the Trainer keeps the token cache: ``<run_dir>/.cache``."""
    return out / "runs" / ".cache"


def _load(out: Path) -> tuple[Corpus, Corpus]:
    """The train and validation splits."""
    from transformer.text.corpus import load_split

    d = _config(out).data
    return load_split(d, d.train_split), load_split(d, d.valid_split)


def _encoding(out: Path) -> tuple[int, Callable[[], list[EncodedCorpus]]]:
    """Load both splits and the saved tokenizer (untimed); return their pairs and their encoding, to be timed."""
    from transformer.text.batching import encode_corpus
    from transformer.text.tokenizer import Tokenizer

    (train, valid), max_len = _load(out), _config(out).data.max_len
    tokenizer = Tokenizer.load(out / "tokenizer.json")
    return len(train) + len(valid), lambda: [
        encode_corpus(c, tokenizer, max_len, cache_dir(out)) for c in (train, valid)
    ]


def stage_generate(out: Path, pairs: int, seed: int) -> dict:
    _, seconds = _timed(lambda: generate(out / "data", pairs, seed))
    return {"seconds": seconds, "pairs": pairs + sum(HELD_OUT.values())}


def stage_load(out: Path) -> dict:
    (train, valid), seconds = _timed(lambda: _load(out))
    return {"seconds": seconds, "pairs": len(train) + len(valid), "dropped_empty": train.dropped_empty}


def stage_tokenizer(out: Path) -> dict:
    from transformer.text.tokenizer import train_tokenizer

    train, _ = _load(out)
    cfg = _config(out).tokenizer
    tokenizer, seconds = _timed(lambda: train_tokenizer(cfg, train))
    tokenizer.save(out / "tokenizer.json")
    return {"seconds": seconds, "pairs": min(cfg.train_sample, len(train)), "vocab_size": tokenizer.vocab_size}


def stage_encode(out: Path) -> dict:
    total, work = _encoding(out)
    (train, _), seconds = _timed(work)
    return {"seconds": seconds, "pairs": total, "train_kept": len(train), "dropped_long": train.dropped_long}


def stage_batch(out: Path) -> dict:
    from transformer.text.batching import make_batches

    train, _ = _encoding(out)[1]()
    cfg = _config(out)
    t = cfg.train
    batches, seconds = _timed(lambda: make_batches(train, t.batch_tokens, cfg.seed, 0, pad_multiple=t.pad_multiple))
    return {
        "seconds": seconds,
        "pairs": len(train),
        "batches": len(batches),
        "dropped_too_long": batches.dropped_too_long,
    }


def library_stages(pairs: int, seed: int) -> dict[str, Callable[[Path], dict]]:
    """The stages that call the library, in order; encode_cached is encode again, in a new process."""
    return {
        "generate": partial(stage_generate, pairs=pairs, seed=seed),
        "load": stage_load,
        "tokenizer": stage_tokenizer,
        "encode": stage_encode,
        "encode_cached": stage_encode,
        "batch": stage_batch,
    }


def _measured(stage: Callable[[Path], dict], out: Path) -> dict:
    """A stage's figures plus the memory of the process that ran it."""
    return {**stage(out), **_memory()}


def in_fresh_process(stage: Callable[[Path], dict], out: Path) -> dict:
    """Run a stage in a new Python process (spawned, not forked, so its memory is its own)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_measured, stage, out).result()


# ---- tfm train itself --------------------------------------------------------------------------------------


def tfm_train(out: Path, overrides: list[str], resume: bool) -> tuple[dict, str]:
    """``tfm train`` on the corpus as a subprocess: its wall seconds, its peak RSS, each line it logged with
    the second it appeared (the model line comes once data, tokenizer and token cache are ready); and its command."""
    args = [
        sys.executable,
        "-m",
        "cli",
        "train",
        "--config",
        str(CONFIG),
        "--data-dir",
        str(out / "data"),
        "--set",
        f"run_dir={out / 'runs'}",
        "--set",
        f"name={RUN_NAME}",
        "--set",
        "train.log_every=1",
        *[a for o in overrides for a in ("--set", o)],
        "--quiet",
        "--resume" if resume else "--overwrite",
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    log = [f"{time.perf_counter() - start:7.2f}s {line.rstrip()}" for line in proc.stderr]
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage; this process stays small
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(args)} failed:\n" + "\n".join(log[-20:]))
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "log": log}, " ".join(["python", *args[1:]])


def update_seconds(out: Path, first_step: int) -> list[float]:
    """Seconds of each update from ``first_step`` on, from the run's log.jsonl (the first includes make_batches)."""
    entries = [json.loads(line) for line in (out / "runs" / RUN_NAME / "log.jsonl").read_text().splitlines()]
    elapsed = {e["step"]: e["elapsed_s"] for e in entries if e["kind"] == "train"}
    previous = [elapsed.get(first_step - 1, 0.0)] + [elapsed[s] for s in sorted(elapsed) if s >= first_step]
    return [round(b - a, 2) for a, b in zip(previous, previous[1:])]


# ---- the whole benchmark -----------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Name -> (bytes, mtime_ns) of every file under ``folder``."""
    return (
        {
            str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        if folder.is_dir()
        else {}
    )


def fresh_out(out: Path) -> None:
    """Empty ``out`` if this benchmark made it (or it is empty); refuse any other folder."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise SystemExit(f"{out} is not empty and was not made by bench.wmt_scale; choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(json.dumps({"made_by": "python -m bench.wmt_scale"}) + "\n")


def machine() -> dict[str, object]:
    """The processor, its cores and the memory every figure depends on."""
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"processor": cpu, "cpus": os.cpu_count(), "ram_gb": round(ram / 2**30, 1)}


def _figure(stage: dict) -> dict:
    """seconds, pairs_per_s, peak_rss_mb (and anon_rss_mb where measured) first, then the stage's own figures."""
    seconds, pairs = stage.pop("seconds"), stage.pop("pairs")
    memory = {k: round(stage.pop(k)) for k in ("peak_rss_mb", "anon_rss_mb") if k in stage}
    return {"seconds": round(seconds, 3), "pairs_per_s": round(pairs / seconds), **memory, "pairs": pairs, **stage}


def run(out: Path, pairs: int, seed: int, overrides: list[str], steps: int) -> dict:
    """Every stage in order; the summary of figures, cache size and cache reuse."""
    fresh_out(out)
    os.environ.update({"HF_HOME": str(out / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    figures, unchanged, commands = {}, {}, []

    def record(name: str, stage: dict, cache_before: dict[str, tuple[int, int]]) -> None:
        if name in MUST_REUSE:
            unchanged[name] = snapshot(cache_dir(out)) == cache_before
        figures[name] = _figure(stage)
        print(f"{name}: {json.dumps(figures[name])}", file=sys.stderr)

    for name, stage in library_stages(pairs, seed).items():
        before = snapshot(cache_dir(out))
        record(name, in_fresh_process(stage, out), before)
    for name, resume in (("train", False), ("resume", True)):
        before = snapshot(cache_dir(out))
        stage, command = tfm_train(out, [f"train.max_steps={steps + 2 * resume}", *overrides], resume)
        commands.append(command)
        first = steps + 1 if resume else 1
        record(name, {"pairs": figures["batch"]["pairs"], "update_s": update_seconds(out, first), **stage}, before)
    return {
        "date": date.today().isoformat(),
        "machine": machine(),
        "torch": _torch_version(),
        "command": " ".join(["python", "-m", "bench.wmt_scale", *sys.argv[1:]]),
        "pairs": pairs,
        "train_overrides": overrides,
        "tfm_commands": commands,
        "figures": figures,
        "cache_bytes": _bytes(cache_dir(out)),
        "dataset_cache_bytes": _bytes(out / "hf"),
        "corpus_bytes": _bytes(out / "data"),
        "cache_unchanged_by": unchanged,
        "second_run_reused_cache": all(unchanged.values()),
    }


def _bytes(folder: Path) -> int:
    return sum(size for size, _ in snapshot(folder).values())


def _torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wmt_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000, help="training pairs to generate (WMT14 en-de: 4.5M)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/wmt_scale"), help="working folder, emptied first")
    parser.add_argument("--seed", type=int, default=1, help="the corpus is a function of --pairs and --seed")
    parser.add_argument("--steps", type=int, default=3, help="updates of the train stage (resume adds 2)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for the train and resume stages only, e.g. model.N=1 (repeatable)",
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    summary = run(args.out.resolve(), args.pairs, args.seed, args.overrides, args.steps)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
