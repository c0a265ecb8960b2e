"""BLEU after the same CPU wall-clock budget: tfm against Hugging Face's MarianMTModel of the same shape.

Both train on the same Multi30k batches (the same 8k joint BPE, ~4,000-token batches, same seed), with
Adam (0.9, 0.98, 1e-9), label smoothing 0.1 and the config's schedule, for ``--minutes`` each. They run
side by side, one process and ``--threads`` threads each, so that whatever else the shared machine does
slows both alike; then both translate test_2016_flickr (beam 5 and greedy) and are scored by the same
sacreBLEU call. tfm trains through its own Trainer (validation off, so the budget is all training);
the peer through the plain loop below. Prints a table, the BLEU ratio, and a JSON line.

Run: python -m bench.bleu_budget --minutes 20 --data ../shared/data/multi30k
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import time
from pathlib import Path

import torch

from bench.common import DEFAULT_DATA, ROOT
from bench.marian_peer import build_marian, marian_logits
from transformer import checkpoint
from transformer.config import Config
from transformer.config_file import load
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.scoring import score
from transformer.text.batching import collate, encode_corpus, make_batches, source_tensor
from transformer.text.corpus import load_split
from transformer.text.tokenizer import train_tokenizer
from transformer.training.loss import label_smoothed_nll
from transformer.training.schedule import learning_rate
from transformer.training.trainer import Trainer

# The peer's recipe as measured on this machine (issue 4): peak 5e-4 after 200 linear warm-up steps.
PEER_RECIPE = {"peak_lr": 5e-4, "warmup": 200}


def train_tfm(cfg, minutes: float) -> tuple[Path, int]:
    """Train tfm for ``minutes`` with validation off; return the final checkpoint and its step."""
    cfg.train.max_minutes = minutes
    cfg.train.eval_every = cfg.train.save_every = 10**9
    result = Trainer(cfg, overwrite=True, quiet=True).run()
    return checkpoint.step_dirs(cfg.out_dir)[-1], result.state.step


def evaluate_tfm(ckpt: Path, src: list[str], refs: list[str], beam: int) -> tuple[float, float, float]:
    """(BLEU, chrF, seconds) of a tfm checkpoint on the test split."""
    t = Translator.from_checkpoint(ckpt, TranslateOptions("cpu", beam=beam, nbest=1))
    start = time.perf_counter()
    hyps = [x.best for x in t.translate(src)]
    s = score(hyps, refs, t.cfg.data.tgt_lang)
    return s.bleu, s.chrf, time.perf_counter() - start


def train_marian(cfg: Config, minutes: float):
    """Train the peer on tfm's batches for ``minutes`` with its own measured recipe.

    Returns (model, tokenizer, steps).
    """
    train = load_split(cfg.data, cfg.data.train_split)
    tok = train_tokenizer(cfg.tokenizer, train)
    torch.manual_seed(cfg.seed)
    peer = build_marian(cfg.model, tok)
    peer.train()
    t = dataclasses.replace(cfg.train, **PEER_RECIPE)
    opt = torch.optim.Adam(peer.parameters(), lr=0.0, betas=tuple(t.betas), eps=t.eps)
    data = encode_corpus(train, tok, cfg.data.max_len, Path(cfg.run_dir) / ".cache-peer")
    step, epoch, start = 0, 0, time.monotonic()
    while time.monotonic() - start < minutes * 60:
        for idx in make_batches(data, t.batch_tokens, cfg.seed, epoch):
            b = collate(data, idx, tok)
            logits = marian_logits(peer, b.src, b.tgt_in, tok.pad_id)
            loss, _ = label_smoothed_nll(logits, b.tgt_out, t.label_smoothing, tok.pad_id)
            (loss / b.n_tokens).backward()
            torch.nn.utils.clip_grad_norm_(peer.parameters(), t.clip_norm)
            step += 1
            for g in opt.param_groups:
                g["lr"] = learning_rate(step, t, cfg.model.d_model)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if time.monotonic() - start >= minutes * 60:
                break
        epoch += 1
    return peer.eval(), tok, step


def evaluate_marian(peer, tok, src: list[str], refs: list[str], beam: int, tgt_lang: str) -> tuple[float, float, float]:
    """(BLEU, chrF, seconds) of the peer with transformers' ``generate``, batches of 64 sentences sorted by length."""
    start = time.perf_counter()
    ids = [tok.encode(s) for s in src]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    hyps = [""] * len(ids)
    with torch.inference_mode():
        for k in range(0, len(order), 64):
            rows = order[k : k + 64]
            x = source_tensor([ids[i] for i in rows], tok)
            out = peer.generate(
                input_ids=x,
                attention_mask=(x != tok.pad_id).long(),
                num_beams=beam,
                max_new_tokens=x.size(1) + 50,
                do_sample=False,
            )
            for r, i in enumerate(rows):
                hyps[i] = tok.decode(out[r].tolist())
    s = score(hyps, refs, tgt_lang)
    return s.bleu, s.chrf, time.perf_counter() - start


def side(name: str, cfg: Config, minutes: float, threads: int, n_test: int | None) -> dict:
    """Train and evaluate one contestant in this process; return its figures."""
    torch.set_num_threads(threads)
    test = load_split(cfg.data, cfg.data.test_split)
    src, refs = list(test.src)[:n_test], list(test.tgt)[:n_test]
    if name == "tfm":
        ckpt, steps = train_tfm(cfg, minutes)
        scores = {b: evaluate_tfm(ckpt, src, refs, b) for b in (5, 1)}
        fingerprint = checkpoint.load(ckpt).tokenizer.fingerprint()
    else:
        peer, tok, steps = train_marian(cfg, minutes)
        scores = {b: evaluate_marian(peer, tok, src, refs, b, cfg.data.tgt_lang) for b in (5, 1)}
        fingerprint = tok.fingerprint()
    return {
        "steps": steps,
        "bleu5": scores[5][0],
        "chrf5": scores[5][1],
        "bleu_greedy": scores[1][0],
        "decode5_s": round(scores[5][2], 1),
        "tokenizer": fingerprint[:12],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bleu_budget", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1, help="threads per contestant (they run side by side)")
    parser.add_argument("--test-sentences", type=int, default=None, help="score only the first N (smoke runs)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "small.yaml"))
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--runs", default=str(ROOT / "runs" / "bench"))
    parser.add_argument("--set", action="append", default=[], help="extra tfm config overrides")
    args = parser.parse_args()
    cfg = load(args.config, [f"data.path={args.data}", f"run_dir={args.runs}", "name=bleu_budget", *args.set])
    with mp.get_context("spawn").Pool(2) as pool:
        jobs = {
            name: pool.apply_async(side, (name, cfg, args.minutes, args.threads, args.test_sentences))
            for name in ("tfm", "marian")
        }
        res = {name: job.get() for name, job in jobs.items()}
    tfm, marian = res["tfm"], res["marian"]
    if tfm["tokenizer"] != marian["tokenizer"]:
        print(f"warning: the two tokenizers differ ({tfm['tokenizer']} vs {marian['tokenizer']})")
    print(
        f"\n{args.minutes:g} min of CPU training each, side by side, {args.threads} thread(s) each; "
        f"{Path(args.config).name} ({cfg.precision}); Multi30k de->en test_2016_flickr"
    )
    print(f"{'':8} {'steps':>6} {'BLEU b5':>8} {'chrF b5':>8} {'BLEU greedy':>12}")
    for name, r in (("tfm", tfm), ("Marian", marian)):
        print(f"{name:8} {r['steps']:>6} {r['bleu5']:>8.2f} {r['chrf5']:>8.2f} {r['bleu_greedy']:>12.2f}")
    ratio = tfm["bleu5"] / max(marian["bleu5"], 1e-9)
    print(f"BLEU ratio tfm / Marian (beam 5): {ratio:.2f}")
    print(
        json.dumps(
            {
                "minutes": args.minutes,
                "threads": args.threads,
                "precision": cfg.precision,
                "tfm": tfm,
                "marian": marian,
                "bleu_ratio": round(ratio, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
