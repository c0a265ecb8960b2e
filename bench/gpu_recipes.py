"""Multi30k recipes for a GPU, searched in one call: both directions' variants train side by side on one card.

Runs bench.recipe_search for ``multi30k-de-en`` and ``multi30k-en-de`` at once, each with the variants in
VARIANTS (the CPU recipe, and wider or deeper models held back by more dropout or a lower rate), for
``--minutes`` each; every run is averaged and scored on val, and the one chosen on val per direction alone on
test. ``--reach`` (default: the CPU recipe's last greedy val BLEU, de->en) gives each run's first minute at that
score, so the JSON holds the learning curves against wall-clock minutes. One JSON per direction.

    python -m bench.gpu_recipes --data data/multi30k --out $OUT                       # on the GPU, about 8 minutes
    python -m bench.gpu_recipes --device cpu --quick --out /tmp/r                     # checks it runs (CI)
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import DEFAULT_DATA, ROOT
from bench.recipe_search import main as recipe_search

DIRECTIONS = ("multi30k-de-en", "multi30k-en-de")
WIDE = "model.d_model=512 model.d_ff=2048 model.h=8"
VARIANTS = {
    "recipe": "",
    "wide03": WIDE,
    "wide04": f"{WIDE} model.dropout=0.4",
    "wide03-lr5e4": f"{WIDE} train.peak_lr=0.0005 train.warmup=1000",
    "base04": f"model.N=6 {WIDE} model.dropout=0.4 train.peak_lr=0.0005 train.warmup=1000",
    "wide03-prenorm": f"{WIDE} model.norm_first=true",
}
CPU_RECIPE_FINAL_GREEDY_VAL_BLEU = 38.74  # bench/results/2026-11-27-multi30k-de-en-repro.json, update 5350
QUICK = [  # 2 updates, outputs of 5 tokens at most: only that every step runs
    *("train.max_steps=2", "train.eval_every=1", "train.save_every=1", "train.keep_last=3"),
    *("train.eval_sentences=4", "decode.max_len_a=0", "decode.max_len_b=5", "tokenizer.vocab_size=1000"),
]
GPU = ["train.max_steps=20000"]  # the early stop (patience) or --minutes ends a run, not the CPU recipe's 5,350


def variant_args(quick: bool) -> list[str]:
    """``--variant`` arguments for bench.recipe_search: all VARIANTS, or with ``quick`` the first (the CPU recipe)."""
    chosen = list(VARIANTS.items())[: 1 if quick else None]
    return [a for name, sets in chosen for a in ("--variant", f"{name} {sets}".strip())]


def main(argv: list[str] | None = None) -> dict[str, dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="the Multi30k folder (--data-dir of every run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--minutes", type=float, default=5.0, help="training minutes per run at most")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per process")
    p.add_argument("--reach", type=float, default=CPU_RECIPE_FINAL_GREEDY_VAL_BLEU)
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "gpu_recipes")
    p.add_argument("--out", type=Path, required=True, help="folder for the two JSON files")
    p.add_argument("--quick", action="store_true", help="the first variant, 2 updates: checks that it runs")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    common = [a for s in (QUICK if args.quick else GPU) for a in ("--set", s)]

    def search(config: str) -> dict:
        return recipe_search(
            [
                *("--config", config, "--data", args.data, "--device", args.device),
                *("--minutes", str(args.minutes), "--threads", str(args.threads), "--reach", str(args.reach)),
                *("--runs", str(args.runs / config), "--json", str(args.out / f"{config}.json"), "--test"),
                *common,
                *variant_args(args.quick),
            ]
        )

    with ThreadPoolExecutor(len(DIRECTIONS)) as pool:
        return dict(zip(DIRECTIONS, pool.map(search, DIRECTIONS)))


if __name__ == "__main__":
    main()
