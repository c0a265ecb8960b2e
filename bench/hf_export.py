"""Does the Hugging Face export translate as tfm does? Token-for-token agreement on a test split, every difference
explained.

The checkpoint is exported with ``tfm export --format hf``, reloaded with transformers alone, and both decode the
same source ids in fp32 on the CPU:
- greedy: tfm's ``greedy_search`` against ``generate(num_beams=1)``;
- beam, same ranking: tfm with alpha 0 against ``generate(num_beams=k, length_penalty=0)``;
- beam, each with its own length penalty: tfm's GNMT alpha from the config against transformers'
  ``length_penalty`` of the exported generation_config, or each ``--length-penalty`` given (the two definitions
  differ; BLEU of each is reported).
A line where the two disagree is explained by the first step they part: a near-tie (the two tokens' log-probs
under tfm within ``--tie`` of each other), or tfm's length limit (a * src_len + b, which transformers cannot
express), or else it is counted as unexplained.

    python -m bench.hf_export --checkpoint runs/multi30k-de-en/best --data-dir $TFM_MULTI30K \\
        --json bench/results/$(date +%F)-hf-export-check.json
    python -m bench.hf_export --checkpoint runs/quickstart/best --data-dir data/sample --split valid --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from datetime import date
from pathlib import Path

import torch

from bench.common import machine
from transformer import checkpoint
from transformer.decoding.search import beam_search, greedy_search, length_penalty, max_output_lengths
from transformer.export.write import export
from transformer.scoring import score
from transformer.text.batching import source_tensor
from transformer.text.corpus import load_split

BATCH = 50


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _log_prob(model, tok, src: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens + <END> | src) under tfm's model, teacher-forced."""
    out = torch.tensor(tokens + [tok.end_id])
    logits = model(src[None], torch.tensor([[tok.start_id] + tokens]))[0].float()
    return float(logits.log_softmax(-1).gather(-1, out[:, None]).sum())


def explain(model, tok, src, ours: list[int], theirs: list[int], limit: int, tie: float, penalties=None) -> str:
    """Why two decodings of one source part: 'length limit', 'near-tie', 'length penalty' (``penalties`` = tfm's
    alpha and transformers' length_penalty rank the two the other way round), 'search path' (different penalties
    led the two beams elsewhere) or 'unexplained'."""
    if len(ours) >= limit or len(theirs) >= limit:
        return "length limit"
    if penalties is not None:
        alpha, lp = penalties
        a, b = _log_prob(model, tok, src, ours), _log_prob(model, tok, src, theirs)
        tfm_prefers_ours = a / length_penalty(len(ours) + 1, alpha) >= b / length_penalty(len(theirs) + 1, alpha)
        hf_prefers_theirs = b / (len(theirs) + 1) ** lp >= a / (len(ours) + 1) ** lp
        return "length penalty" if tfm_prefers_ours and hf_prefers_theirs else "search path"
    ours, theirs = ours + [tok.end_id], theirs + [tok.end_id]
    t = _first_difference(ours, theirs)
    lprobs = model(src[None], torch.tensor([[tok.start_id] + ours[:t]]))[0, -1].float().log_softmax(-1)
    return "near-tie" if abs(float(lprobs[ours[t]] - lprobs[theirs[t]])) <= tie else "unexplained"


def _tfm(model, ids: list[list[int]], tok, beam: int, alpha: float, d) -> list[list[int]]:
    out = []
    for i in range(0, len(ids), BATCH):
        src = source_tensor(ids[i : i + BATCH], tok)
        if beam == 1:
            hyps = greedy_search(model, src, tok.start_id, tok.end_id, d.max_len_a, d.max_len_b)
            out += [h.tokens for h in hyps]
        else:
            hyps = beam_search(model, src, tok.start_id, tok.end_id, beam, alpha, 1, d.max_len_a, d.max_len_b)
            out += [h[0].tokens for h in hyps]
    return out


def _hf(marian, ids: list[list[int]], tok, **generate) -> list[list[int]]:
    out = []
    for i in range(0, len(ids), BATCH):
        src = source_tensor(ids[i : i + BATCH], tok)
        with torch.no_grad():
            rows = marian.generate(input_ids=src, attention_mask=(src != tok.pad_id).long(), **generate)
        for row in rows[:, 1:].tolist():
            out.append(row[: row.index(tok.end_id)] if tok.end_id in row else [t for t in row if t != tok.pad_id])
    return out


def compare(loaded, src_ids, refs, ours, theirs, tie: float, penalties=None) -> dict:
    """Agreement, the reasons for each difference, and the BLEU of both sides."""
    tok, d = loaded.tokenizer, loaded.cfg.decode
    limits = max_output_lengths(torch.tensor([len(ids) + 1 for ids in src_ids]), d.max_len_a, d.max_len_b).tolist()
    reasons: dict[str, int] = {}
    for ids, a, b, limit in zip(src_ids, ours, theirs, limits):
        if a != b:
            why = explain(loaded.model, tok, source_tensor([ids], tok)[0], a, b, limit, tie, penalties)
            reasons[why] = reasons.get(why, 0) + 1
    lang = loaded.cfg.data.tgt_lang
    same = sum(a == b for a, b in zip(ours, theirs))
    return {
        "same": same,
        "lines": len(ours),
        "agreement": round(same / max(1, len(ours)), 4),
        "differences": reasons,
        "bleu_tfm": round(score(tok.decode_batch(ours), refs, lang).bleu, 2),
        "bleu_hf": round(score(tok.decode_batch(theirs), refs, lang).bleu, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data-dir", required=True, help="where the checkpoint's corpus lies")
    ap.add_argument("--split", default=None, help="default: the config's test split")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--tie", type=float, default=1e-4, help="log-prob gap under which two tokens are a near-tie")
    ap.add_argument(
        "--length-penalty",
        type=float,
        action="append",
        help="transformers' length_penalty set against tfm's alpha (repeatable; default: the exported one)",
    )
    ap.add_argument("--quick", action="store_true", help="20 lines, greedy and one beam comparison (CI)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_grad_enabled(False)

    from transformers import AutoTokenizer, MarianMTModel

    loaded = checkpoint.load(args.checkpoint)
    loaded.model.eval()
    cfg, tok = loaded.cfg, loaded.tokenizer
    split = args.split or cfg.data.test_split
    corpus = load_split(dataclasses.replace(cfg.data, path=args.data_dir), split)
    sources, refs = list(corpus.src), list(corpus.tgt)
    if args.quick:
        sources, refs = sources[:20], refs[:20]
    with tempfile.TemporaryDirectory() as tmp:
        folder = export(args.checkpoint, Path(tmp) / "hf", fmt="hf")
        hf_tok = AutoTokenizer.from_pretrained(folder)
        marian = MarianMTModel.from_pretrained(folder).eval()
    src_ids = [tok.encode(s) for s in sources]
    same_ids = sum(hf_tok(s).input_ids == ids + [tok.end_id] for s, ids in zip(sources, src_ids))
    limit = dict(max_new_tokens=marian.generation_config.max_new_tokens)  # the export's own cap
    runs = {
        "greedy": ((1, 0.0), dict(num_beams=1, **limit)),
        f"beam{args.beam}_alpha0": ((args.beam, 0.0), dict(num_beams=args.beam, length_penalty=0.0, **limit)),
    }
    if not args.quick:  # the exported generation_config's length penalty against the config's alpha
        for lp in args.length_penalty or [marian.generation_config.length_penalty]:
            hf_beam = dict(num_beams=args.beam, length_penalty=lp, **limit)
            runs[f"beam{args.beam}_alpha{cfg.decode.alpha:g}_vs_length_penalty{lp:g}"] = (
                (args.beam, cfg.decode.alpha),
                hf_beam,
            )
    given = [(k, x) for k, v in vars(args).items() for x in (v if isinstance(v, list) else [v])]
    options = [f"--{k.replace('_', '-')} {v}" for k, v in given if not (v is None or isinstance(v, bool))]
    result = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "command": " ".join(["python -m bench.hf_export", *options] + (["--quick"] if args.quick else [])),
        "checkpoint": {
            "path": args.checkpoint,
            "step": loaded.meta.get("step"),
            "model": dataclasses.asdict(cfg.model),
        },
        "split": split,
        "source_ids_equal": f"{same_ids}/{len(sources)}",
    }
    for name, ((beam, alpha), generate) in runs.items():
        ours = _tfm(loaded.model, src_ids, tok, beam, alpha, cfg.decode)
        theirs = _hf(marian, src_ids, tok, **generate)
        penalties = (alpha, generate["length_penalty"]) if alpha != generate.get("length_penalty", 0.0) else None
        figures = compare(loaded, src_ids, refs, ours, theirs, args.tie, penalties)
        result[name] = {"tfm": {"beam": beam, "alpha": alpha}, "hf": generate, **figures}
        print(name, json.dumps(result[name]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
