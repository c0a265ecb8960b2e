"""Each speed lever tfm uses, measured alone: the same work without and with it, alternated round by round.

"Without" is what runs when the lever is absent: PyTorch's defaults (OpenMP threads spin-waiting,
per-tensor Adam, nn.Dropout, whole logits scored by ``label_smoothed_nll``, the flash SDPA kernel in bf16 training) or
a stand-in written here (copying the whole K/V cache capacity, topk over the whole vocabulary,
batches in input order, greedy search that keeps finished sentences, no_grad for inference_mode,
both CPU threads for a single sentence).
A speedup above 1 means the lever wins; decoding levers also report whether outputs stayed the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

import transformer.model as model_module
import transformer.search as search_module
import transformer.translator as translator_module
from common import ROOT, interleave, median, paired_ratio
from decode_speed import tfm_decoder
from train_speed import model_factory, optimizer, own_processes, tfm_step
from transformer import checkpoint
from transformer.batching import Batch, source_tensor
from transformer.config import Config
from transformer.decoder_state import BufferPool, DecoderState
from transformer.model import Dropout
from transformer.search import beam_search, greedy_search
from transformer.tokenizer import Tokenizer


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Temporarily replace ``obj.name`` (the 'without' side of a lever)."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def lever_row(lever: str, workload: str, times: dict[str, list[float]], same: bool | None = None) -> dict[str, Any]:
    """One lever's result: median seconds without and with it, and the paired speedup (bench/gpu.py uses it too)."""
    row = {"lever": lever, "workload": workload, "without_s": median(times["without"]),
           "with_s": median(times["with"]), "speedup": paired_ratio(times["without"], times["with"])}
    return row if same is None else {**row, "same_output": same}


# ----- process-wide: how idle OpenMP threads wait -------------------------------------------------------

OMP_SETTINGS = {"libgomp default": {}, "tfm: GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
                "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}
HOG = "import torch\na = torch.randn(512, 512)\nwhile True:\n    a @ a\n    torch.randn(64, 256).relu().sum()"


def omp_waiting(ckpt: str, data: str, rounds: int, hogs: int = 0) -> list[dict[str, Any]]:
    """bench/omp_worker.py in fresh processes under each OMP_SETTINGS entry, alternated.

    With ``hogs``, that many other torch processes (2 threads, libgomp's default) keep the CPU busy
    meanwhile, as other people's jobs do on a shared machine.
    """
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    busy = [subprocess.Popen([sys.executable, "-c", HOG], env=clean) for _ in range(hogs)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in OMP_SETTINGS}
    try:
        def worker(name: str) -> Callable[[int], float]:
            def run(_: int) -> float:
                out = subprocess.run([sys.executable, str(ROOT / "bench" / "omp_worker.py"), ckpt, data],
                                     env={**clean, **OMP_SETTINGS[name]}, check=True, capture_output=True, text=True)
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                return 0.0
            return run

        interleave({name: worker(name) for name in OMP_SETTINGS}, rounds)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    where = f"{hogs} busy torch processes" if hogs else "no added load"
    rows = []
    for key, work in (("decode_s", "beam 5, batch 32"), ("train_s", "3 training steps, 1.5k tokens")):
        base = [x[key] for x in results["libgomp default"]]
        for name in list(OMP_SETTINGS)[1:]:
            times = {"without": base, "with": [x[key] for x in results[name]]}
            rows.append(lever_row(f"{name} (vs libgomp default)", f"{work}; {where}", times))
    return rows


# ----- training ---------------------------------------------------------------------------------------------

def _plain_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, Dropout):
            m.__class__ = nn.Dropout
    return model


def _patched_step(step: Callable[[int], None], obj: Any, name: str, value: Any) -> Callable[[int], None]:
    """``step`` run with ``obj.name`` replaced by ``value``: the step without a lever."""
    def run(r: int) -> None:
        with patched(obj, name, value):
            step(r)
    return run


def without_with(without: Callable[[int], None], with_: Callable[[int], None], rounds: int,
                 warmup: int) -> dict[str, list[float]]:
    """Seconds per round of both, alternated, the ``warmup`` first rounds left out (bench/gpu.py uses it too)."""
    times = interleave({"without": without, "with": with_}, warmup + rounds)
    return {k: v[warmup:] for k, v in times.items()}


def training(cfg: Config, tok: Tokenizer, batches: list[Batch], rounds: int, warmup: int = 1) -> list[dict[str, Any]]:
    """Whole training steps of ``cfg``'s shape on the bench batches, one lever toggled at a time."""
    model = model_factory(cfg, tok)

    def with_lever(precision: str = "fp32") -> Callable[[int], None]:
        m = model()
        return tfm_step(m, optimizer(m, cfg), batches, precision, cfg)

    cases: list[tuple[str, str, Callable[[int], None], Callable[[int], None]]] = []
    m = model()
    cases.append(("fused Adam (CPU)", "fp32", tfm_step(m, optimizer(m, cfg, fused=False), batches, "fp32", cfg),
                  with_lever()))
    m = model()
    cases.append(("generator and loss fused, 128 rows at a time", "fp32",
                  tfm_step(m, optimizer(m, cfg), batches, "fp32", cfg, fused_loss=False), with_lever()))
    m = _plain_dropout(model())
    cases.append(("CPU dropout, 4 masks per random int64", "fp32", tfm_step(m, optimizer(m, cfg), batches, "fp32", cfg),
                  with_lever()))
    m = model()
    cases.append(("no source masks for a batch without source padding", "fp32",
                  _patched_step(tfm_step(m, optimizer(m, cfg), batches, "fp32", cfg), model_module, "source_masks",
                                model_module.safe_mask), with_lever()))
    m = model()
    cases.append(("math SDPA for bf16 training", "bf16",
                  _patched_step(tfm_step(m, optimizer(m, cfg), batches, "bf16", cfg), model_module, "sdpa_kernel",
                                lambda *_: contextlib.nullcontext()), with_lever("bf16")))
    rows = []
    for lever, precision, without, with_ in cases:
        times = without_with(without, with_, rounds, warmup)
        rows.append(lever_row(lever, f"{cfg.name} training step, {precision}", times))
    return rows


def freed_memory(cfg: Config, tok: Tokenizer, batches: list[Batch], rounds: int, warmup: int = 2) -> dict[str, Any]:
    """glibc keeping freed memory (transformer/allocator.py): a process-wide setting, so each side has a process."""
    workers = {"without": ["tfm", "--glibc-defaults"], "with": ["tfm"]}
    with own_processes(cfg, tok, batches, "fp32", workers) as steps:
        times = without_with(steps["without"], steps["with"], rounds, warmup)
    return lever_row("glibc keeps freed memory (`tfm train` sets it)", f"{cfg.name} training step, fp32", times)


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
    return {**lever_row("torch.compile (not used: config compile is refused)", f"{cfg.name} training step, fp32", times),
            "first_compiled_step_s": first}


# ----- decoding ---------------------------------------------------------------------------------------------

def _full_copy_select(self: DecoderState, index: Tensor, beam: int | None = None) -> None:
    """DecoderState.select as it was: index_select over the whole cache capacity."""
    self.self_kv = self.self_kv.index_select(0, index)
    width, self.beam = self.beam, beam or self.beam
    sentences = index[:: self.beam] // width
    if self.beam == 1 or sentences.numel() != self.cross_kv.size(0):
        self.cross_kv = self.cross_kv.index_select(0, sentences)
        self.src_mask = self.src_mask.index_select(0, sentences)


def _keep_finished_greedy(model: nn.Module, src: Tensor, start_id: int, end_id: int) -> list[list[int]]:
    """Greedy search that decodes every sentence until the last one ends (no rows dropped), as generate does."""
    model.eval()
    with torch.inference_mode():
        state = model.start_state(*model.encode(src))
        limits = search_module.max_output_lengths((src != model.pad_id).sum(1), 1.0, 50)
        tokens = src.new_full((src.size(0),), start_id)
        out, done = [], torch.zeros(src.size(0), dtype=torch.bool)
        for t in range(int(limits.max()) + 1):
            logits = model.decode_step(tokens, state)
            logits[:, [model.pad_id, start_id]] = float("-inf")
            tokens = logits.argmax(-1).masked_fill(t >= limits, end_id).masked_fill(done, model.pad_id)
            out.append(tokens)
            done |= tokens == end_id
            if done.all():
                break
    rows = torch.stack(out, 1).tolist()
    return [r[: r.index(end_id)] if end_id in r else r for r in rows]


def decoding(loaded: checkpoint.Loaded, lines: list[str], rounds: int) -> list[dict[str, Any]]:
    """Search over the test set's sentences in batches of 32, one lever toggled at a time."""
    tok, model = loaded.tokenizer, loaded.model.eval()
    ids = tok.encode_batch(lines)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    sorted_batches = [source_tensor([ids[i] for i in order[k:k + 32]], tok) for k in range(0, len(ids), 32)]
    chunks = [ids[k:k + 128] for k in range(0, len(ids), 128)][:rounds]  # the sorting lever: 128 lines a round
    step = max(len(sorted_batches) // rounds, 1)
    picks = list(range(0, len(sorted_batches), step))[:rounds]  # spread over short and long sentences
    s, e = tok.start_id, tok.end_id

    def beam(r: int, alpha: float = 0.6) -> list[list[int]]:
        return [h[0].tokens for h in beam_search(model, sorted_batches[picks[r]], s, e, beam=5, alpha=alpha)]

    def greedy(batches: list[Tensor]) -> Callable[[int], list[list[int]]]:
        return lambda r: [h.tokens for h in greedy_search(model, batches[picks[r]], s, e)]

    def without_topk(r: int) -> list[list[int]]:
        with patched(search_module, "row_topk", lambda x, m: x.topk(m, dim=1)):
            return beam(r)

    wide = [source_tensor([ids[i] for i in order[k:k + 256]], tok) for k in range(0, len(ids), 256)]

    def greedy_wide(r: int) -> list[list[int]]:
        """256 sentences a batch, about what tfm translate's default 4,096-token batches hold."""
        return [h.tokens for h in greedy_search(model, wide[r % len(wide)], s, e)]

    def without_row_max(r: int) -> list[list[int]]:
        with patched(search_module, "row_max", lambda x: x.max(dim=1, keepdim=True)):
            return greedy_wide(r)

    def without_prefix(r: int) -> list[list[int]]:
        with patched(DecoderState, "select", _full_copy_select):
            return beam(r)

    def without_pool(r: int) -> list[list[int]]:
        with patched(model, "kv_pool", BufferPool(keep=0)):
            return beam(r)

    def without_settled(r: int) -> list[list[int]]:
        with patched(search_module._Search, "settled", lambda *_: False):
            return beam(r, alpha=0.0)

    translate = tfm_decoder(loaded)

    def one_sentence(r: int) -> list[list[str]]:
        """Eight single-sentence translations (one alone is too short to time on a shared machine)."""
        return [translate([lines[(picks[r] + i) % len(lines)]], 5) for i in range(8)]

    def one_sentence_two_threads(r: int) -> list[list[str]]:
        with patched(translator_module, "decoding_threads", lambda *_: contextlib.nullcontext()):
            return one_sentence(r)

    def without_inference_mode(r: int) -> list[list[int]]:
        with patched(torch, "inference_mode", torch.no_grad):
            return greedy(sorted_batches)(r)

    def chunk_batches(r: int, sort: bool) -> list[Tensor]:
        chunk = sorted(chunks[r], key=len) if sort else chunks[r]
        return [source_tensor(chunk[k:k + 32], tok) for k in range(0, len(chunk), 32)]

    def by_chunk(sort: bool) -> Callable[[int], list[list[int]]]:
        return lambda r: sorted(h.tokens for b in chunk_batches(r, sort) for h in greedy_search(model, b, s, e))

    cases = [("K/V cache: reorder only the filled positions", "beam 5, batch 32", without_prefix, beam),
             ("K/V cache memory reused from batch to batch", "beam 5, batch 32", without_pool, beam),
             ("a sentence leaves once no live beam can win", "beam 5, batch 32, alpha 0", without_settled,
              lambda r: beam(r, alpha=0.0)),
             ("top-k by block maxima", "beam 5, batch 32", without_topk, beam),
             ("argmax by block maxima", "greedy, batch 256", without_row_max, greedy_wide),
             ("inference_mode (vs no_grad)", "greedy, batch 32", without_inference_mode, greedy(sorted_batches)),
             ("drop finished sentences", "greedy, batch 32",
              lambda r: _keep_finished_greedy(model, sorted_batches[picks[r]], s, e), greedy(sorted_batches)),
             ("sort by length before batching", "greedy, batch 32", by_chunk(False), by_chunk(True)),
             ("one CPU thread below 64 rows", "beam 5, 1 sentence x 8", one_sentence_two_threads, one_sentence)]
    rows = []
    for lever, work, without, with_ in cases:
        outs: dict[str, dict[int, Any]] = {"without": {}, "with": {}}

        def keep(side: str, f: Callable[[int], Any]) -> Callable[[int], None]:
            def run(r: int) -> None:
                outs[side][r] = f(r)
            return run

        times = interleave({"without": keep("without", without), "with": keep("with", with_)},
                           len(chunks) if lever.startswith("sort") else len(picks))
        rows.append(lever_row(lever, work, times, outs["without"] == outs["with"]))
    return rows
