"""Each speed lever tfm uses, measured alone: the same work without and with it, alternated round by round.

"Without" is switched through the library's public API or the environment, never by patching it:
PyTorch's per-tensor Adam, nn.Dropout in place of model.speed.Dropout, whole logits scored by
``label_smoothed_nll``, libgomp's OpenMP defaults (each side a process of its own), batches in input
order, torch's topk in place of the block-wise one, the decoding copy's modules called through nn.Module,
and encoder-decoder attention unfolded. A speedup above 1 means the lever wins; decoding levers also report
whether outputs stayed the same. A lever that can no longer be switched off is measured once, recorded in
bench/results/, and left out of this suite.

Sections: levers (all of them but compile), steps (the decoding step's levers alone, more rounds), contended,
compile.

Run: python -m bench.levers --checkpoint DIR [--data DIR] [--quick] [--sections levers,steps,contended,compile]
[--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.common import DEFAULT_DATA, ROOT, interleave, machine, median, paired_ratio, shape_config
from bench.train_speed import bench_batches, model_factory, optimizer, tfm_step
from transformer import checkpoint
from transformer.config import Config, DataConfig
from transformer.decoding.search import beam_search, greedy_search
from transformer.decoding.topk import row_topk
from transformer.model.decoding_copy import decoding_model, precision_copy
from transformer.model.speed import Dropout, called_directly
from transformer.model.transformer import Transformer
from transformer.runtime.process import OMP_KEYS, SHARED_CPU
from transformer.text.batching import Batch, source_tensor
from transformer.text.corpus import load_split
from transformer.text.tokenizer import Tokenizer


def lever_row(lever: str, workload: str, times: dict[str, list[float]], same: bool | None = None) -> dict[str, Any]:
    """One lever's result: median seconds without and with it, and the paired speedup (bench.gpu uses it too)."""
    row = {
        "lever": lever,
        "workload": workload,
        "without_s": median(times["without"]),
        "with_s": median(times["with"]),
        "speedup": paired_ratio(times["without"], times["with"]),
    }
    return row if same is None else {**row, "same_output": same}


def without_with(
    without: Callable[[int], None], with_: Callable[[int], None], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds per round of both, alternated, the ``warmup`` first rounds left out (bench.gpu uses it too)."""
    times = interleave({"without": without, "with": with_}, warmup + rounds)
    return {k: v[warmup:] for k, v in times.items()}


# ----- process-wide: how idle OpenMP threads wait, how many threads decode --------------------------------

PROCESS_SETTINGS = {
    "libgomp default": {},
    "TFM_SHARED_CPU=1": {SHARED_CPU: "1"},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
}
WORKLOADS = {
    "decode_s": "beam 5, batch 32",
    "single_s": "beam 5, 1 sentence x 8",
    "train_s": "3 training steps, 1.5k tokens",
}
HOG = "import torch\na = torch.randn(512, 512)\nwhile True:\n    a @ a\n    torch.randn(64, 256).relu().sum()"


def omp_waiting(ckpt: str, data: str, rounds: int, hogs: int = 0) -> list[dict[str, Any]]:
    """bench.omp_worker in fresh processes under each PROCESS_SETTINGS entry, alternated.

    With ``hogs``, that many other torch processes (2 threads, libgomp's default) keep the CPU busy
    meanwhile, as other people's jobs do on a shared machine.
    """
    clean = {k: v for k, v in os.environ.items() if k not in (*OMP_KEYS, SHARED_CPU)}
    busy = [subprocess.Popen([sys.executable, "-c", HOG], env=clean) for _ in range(hogs)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in PROCESS_SETTINGS}
    try:

        def worker(name: str) -> Callable[[int], float]:
            def run(_: int) -> float:
                out = subprocess.run(
                    [sys.executable, "-m", "bench.omp_worker", ckpt, data],
                    cwd=ROOT,
                    env={**clean, **PROCESS_SETTINGS[name]},
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                return 0.0

            return run

        interleave({name: worker(name) for name in PROCESS_SETTINGS}, rounds)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    where = f"{hogs} busy torch processes" if hogs else "no added load"
    rows = []
    for key, work in WORKLOADS.items():
        base = [x[key] for x in results["libgomp default"]]
        for name in list(PROCESS_SETTINGS)[1:]:
            times = {"without": base, "with": [x[key] for x in results[name]]}
            rows.append(lever_row(f"{name} (vs libgomp default)", f"{work}; {where}", times))
    return rows


# ----- training ---------------------------------------------------------------------------------------------


def plain_dropout(model: nn.Module) -> nn.Module:
    """``model`` with torch's nn.Dropout in place of every kernels.Dropout."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, nn.Dropout(child.p))
    return model


def training(cfg: Config, tok: Tokenizer, batches: list[Batch], rounds: int, warmup: int = 1) -> list[dict[str, Any]]:
    """Whole training steps of ``cfg``'s shape on the bench batches, one lever toggled at a time."""
    model = model_factory(cfg, tok)

    def step(m: nn.Module, fused_adam: bool | None = None, fused_loss: bool = True) -> Callable[[int], None]:
        return tfm_step(m, optimizer(m, cfg, fused=fused_adam), batches, "fp32", cfg, fused_loss=fused_loss)

    cases = [
        ("fused Adam (CPU)", step(model(), fused_adam=False)),
        ("generator and loss fused, 128 rows at a time", step(model(), fused_loss=False)),
        ("CPU dropout, 4 masks per random int64", step(plain_dropout(model()))),
    ]
    return [
        lever_row(lever, f"{cfg.name} training step, fp32", without_with(without, step(model()), rounds, warmup))
        for lever, without in cases
    ]


def compiled(cfg: Config, tok: Tokenizer, batches: list[Batch], rounds: int) -> dict[str, Any]:
    """torch.compile (dynamic shapes: batch lengths vary) against eager, after a first compiling step."""
    eager = model_factory(cfg, tok)()
    base = model_factory(cfg, tok)()
    opt = optimizer(base, cfg)
    with_step = tfm_step(torch.compile(base, dynamic=True), opt, batches, "fp32", cfg)
    start = time.perf_counter()
    with_step(0)
    first = time.perf_counter() - start
    step = tfm_step(eager, optimizer(eager, cfg), batches, "fp32", cfg)
    step(0)
    times = interleave({"without": step, "with": with_step}, rounds)
    return {
        **lever_row("torch.compile on a CPU (train.compile is CUDA only)", f"{cfg.name} training step, fp32", times),
        "first_compiled_step_s": first,
    }


# ----- decoding ---------------------------------------------------------------------------------------------


def repeated(f: Callable[[Tensor], tuple[Tensor, Tensor]], x: Tensor, calls: int) -> Callable[[int], None]:
    """A round of ``calls`` calls f(x)."""

    def run(_: int) -> None:
        for _ in range(calls):
            f(x)

    return run


def search_kernels(loaded: checkpoint.Loaded, lines: list[str], rounds: int, calls: int = 200) -> list[dict[str, Any]]:
    """The block-wise top-k of transformer.decoding.topk against torch's topk, ``calls`` calls a round.

    On the checkpoint's own next-token log-probs (its first 8 greedy steps over 32 test sentences), in
    the shape beam search scores them: beam 5 over 32 sentences takes the top 10 of 160 rows.
    """
    tok, model = loaded.tokenizer, loaded.model.eval()
    src = source_tensor(tok.encode_batch(lines[:32]), tok)
    steps = []
    with torch.inference_mode():
        state = model.start_state(*model.encode(src))
        tokens = src.new_full((src.size(0),), tok.start_id)
        for _ in range(8):
            steps.append(F.log_softmax(model.decode_step(tokens, state), dim=-1))
            tokens = steps[-1].argmax(-1)
    lprobs = torch.cat(steps)
    cases = [
        (
            "top-k by block maxima (row_topk)",
            "top 10 of [160, V] log-probs",
            lprobs[:160],
            lambda x: x.topk(10, dim=1),
            lambda x: row_topk(x, 10),
        ),
    ]
    rows = []
    for lever, work, x, without, with_ in cases:
        same = all(torch.equal(a, b) for a, b in zip(without(x), with_(x)))
        times = without_with(repeated(without, x, calls), repeated(with_, x, calls), rounds, 1)
        rows.append(lever_row(lever, f"{work}, {calls} calls", times, same))
    return rows


def recording(f: Callable[[int], Any], outputs: dict[int, Any]) -> Callable[[int], None]:
    """f, keeping the output of round r in ``outputs[r]``."""

    def run(r: int) -> None:
        outputs[r] = f(r)

    return run


def decoding(loaded: checkpoint.Loaded, lines: list[str], rounds: int) -> list[dict[str, Any]]:
    """Greedy search over the test set's sentences in batches of 32, with and without sorting them by length."""
    tok, model = loaded.tokenizer, loaded.model.eval()
    ids = tok.encode_batch(lines)
    chunks = [ids[k : k + 128] for k in range(0, len(ids), 128)][:rounds]  # 128 lines a round
    s, e = tok.start_id, tok.end_id

    def chunk_batches(r: int, sort: bool) -> list[Tensor]:
        chunk = sorted(chunks[r], key=len) if sort else chunks[r]
        return [source_tensor(chunk[k : k + 32], tok) for k in range(0, len(chunk), 32)]

    def by_chunk(sort: bool) -> Callable[[int], list[list[int]]]:
        return lambda r: sorted(h.tokens for b in chunk_batches(r, sort) for h in greedy_search(model, b, s, e))

    outs: dict[str, dict[int, Any]] = {"without": {}, "with": {}}
    times = interleave(
        {"without": recording(by_chunk(False), outs["without"]), "with": recording(by_chunk(True), outs["with"])},
        len(chunks),
    )
    return [lever_row("sort by length before batching", "greedy, batch 32", times, outs["without"] == outs["with"])]


def one_at_a_time(
    loaded: checkpoint.Loaded, lines: list[str], rounds: int, models: dict[str, nn.Module], pairs: dict[str, tuple]
) -> list[dict[str, Any]]:
    """Greedy and beam 5 search one sentence at a time through ``models``, alternated round by round (16 lines a
    round), after an untimed greedy pass of every model over every line; a row for each lever of ``pairs``: its
    name -> (the model without it, the model with it)."""
    tok = loaded.tokenizer
    ids = tok.encode_batch(lines)
    chunks = [ids[k : k + 16] for k in range(0, len(ids), 16)][:rounds]
    s, e = tok.start_id, tok.end_id
    searches: dict[str, Callable[[nn.Module, Tensor], list[int]]] = {
        "greedy, batch 1": lambda m, src: greedy_search(m, src, s, e)[0].tokens,
        "beam 5, batch 1": lambda m, src: beam_search(m, src, s, e, beam=5)[0][0].tokens,
    }
    for m in models.values():  # a new source length builds oneDNN kernels once for all: not on the clock of the first
        for x in sum(chunks, []):
            searches["greedy, batch 1"](m, source_tensor([x], tok))
    rows = []
    for workload, search in searches.items():

        def by_line(m: nn.Module, search=search) -> Callable[[int], list[list[int]]]:
            return lambda r: [search(m, source_tensor([x], tok)) for x in chunks[r]]

        outs: dict[str, dict[int, Any]] = {k: {} for k in models}
        times = interleave({k: recording(by_line(m), outs[k]) for k, m in models.items()}, len(chunks))
        for lever, (a, b) in pairs.items():
            rows.append(lever_row(lever, workload, {"without": times[a], "with": times[b]}, outs[a] == outs[b]))
    return rows


def directly(model: Transformer) -> Transformer:
    """``model`` with its modules called straight through their forward (model.speed.called_directly)."""
    called_directly(model)
    return model


def step_levers(loaded: checkpoint.Loaded, lines: list[str], rounds: int) -> list[dict[str, Any]]:
    """The modules decoding swaps into the model on a CPU, each measured alone inside the model's one step, as the
    Translator decodes: the copy's modules called straight through their forward (called_directly), and
    encoder-decoder attention folded into its float projections in fp32 and int8 (int8's outputs may differ: folded,
    its encoder-decoder projections are the fp32 ones). "same model" is the model against itself: the noise."""
    model, cpu = loaded.model.eval(), torch.device("cpu")
    models = {
        "stored": model,
        "stored again": model,
        "called directly": directly(precision_copy(model, "fp32")),
        "fp32 folded": decoding_model(model, "fp32", cpu),
        "int8": directly(precision_copy(model, "int8")),
        "int8 folded": decoding_model(model, "int8", cpu),
    }
    pairs = {
        "same model (the noise of this measurement)": ("stored", "stored again"),
        "decoding copy's modules called directly (CPU fp32)": ("stored", "called directly"),
        "cross-attention folded (CPU fp32)": ("called directly", "fp32 folded"),
        "cross-attention folded (CPU int8)": ("int8", "int8 folded"),
    }
    return one_at_a_time(loaded, lines, rounds, models, pairs)


def measure(loaded: checkpoint.Loaded, data: str, lines: list[str], quick: bool, cache: str) -> list[dict[str, Any]]:
    """Every lever above but torch.compile, on the small shape's training batches and the test set's lines."""
    rounds = 4 if quick else 8
    cfg = shape_config("small", data)
    batches = bench_batches(cfg, loaded.tokenizer, 8, cache)
    return (
        omp_waiting(str(loaded.path), data, 2 if quick else 4)
        + training(cfg, loaded.tokenizer, batches, rounds)
        + search_kernels(loaded, lines, rounds)
        + decoding(loaded, lines, rounds)
        + step_levers(loaded, lines, rounds)
    )


def row_line(r: dict[str, Any]) -> str:
    """One lever as a table line: with and without (median seconds), the speedup, the workload."""
    note = "" if "same_output" not in r else (" same output" if r["same_output"] else " OUTPUT DIFFERS")
    if "first_compiled_step_s" in r:
        note += f", first step {r['first_compiled_step_s']:.0f} s"
    return (
        f"{'lever: ' + r['lever']:<60} {r['with_s']:>10.3f} {r['without_s']:>10.3f} {r['speedup']:>6.2f}x "
        f"{r['workload']}{note}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.levers", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a trained small checkpoint")
    parser.add_argument("--data", default=DEFAULT_DATA, help="Multi30k folder")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--sections", default="levers", help="any of levers,steps,contended,compile")
    parser.add_argument("--json", type=Path, help="also write the rows here, with the command and the machine")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench", help="scratch folder (token cache)")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    loaded = checkpoint.load(args.checkpoint)
    lines = list(load_split(DataConfig(format="multi30k", path=args.data), "test_2016_flickr").src)
    rows = []
    if "levers" in sections:
        rows += measure(loaded, args.data, lines, args.quick, str(args.runs / ".cache"))
    if "steps" in sections:
        rows += step_levers(loaded, lines, 4 if args.quick else 12)
    if "contended" in sections:
        rows += omp_waiting(str(args.checkpoint), args.data, 2 if args.quick else 4, 3)
    if "compile" in sections:
        cfg = shape_config("small", args.data)
        batches = bench_batches(cfg, loaded.tokenizer, 8, str(args.runs / ".cache"))
        rows.append(compiled(cfg, loaded.tokenizer, batches, 4 if args.quick else 8))
    print(f"{'':<60} {'with s':>10} {'without s':>10} {'speedup':>7}")
    print("\n".join(row_line(r) for r in rows))
    if args.json:
        record = {"command": " ".join(sys.argv), "machine": machine(), "rows": rows}
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
