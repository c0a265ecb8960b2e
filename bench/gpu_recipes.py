"""Multi30k recipes for a GPU, searched in one call: both directions' variants train side by side on one card.

Runs bench.recipe_search for ``multi30k-de-en`` and ``multi30k-en-de`` at once, each with the variants in
VARIANTS (the CPU recipe with three seeds, and the paper's 6-layer, 8-head, d_model 512 shape held back for 29,000
pairs in three ways), for ``--minutes`` each. Validation during training is greedy on the first 400 val sentences every
500 updates (a small share of each run); at the end each run's ``best/`` and the means of its last 3 and last 5
checkpoints are translated on the whole val split with beam 5 at every length penalty of ALPHAS, each run's
checkpoint and penalty are chosen on val, the recipe's three seeds also decode together as an ensemble (ENSEMBLE,
its penalty chosen on val), and whichever of the best run and the ensemble val chooses is scored on test, alone
(the best run is also written with its penalty as ``<run>.chosen``). One JSON per direction, and ``curves.png``:
greedy val BLEU against wall-clock seconds, one line per run. Sized for one H100 or H200 in about 8 minutes (twelve
runs share the card: the seeds add load that six did not, so the recipe may reach fewer updates than in round one).

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
PAPER_SHAPE = "model.N=6 model.d_model=512 model.d_ff=2048 model.h=8 model.dropout=0.3"
VARIANTS = {
    "recipe": "",
    # the same recipe from other seeds: the card trains them in the minutes one run takes, and they decode together
    "recipe-seed2": "seed=2",
    "recipe-seed3": "seed=3",
    # pre-norm trains a deep model at a higher rate; attention and ReLU dropout hold it back on few pairs
    "base-pre": f"{PAPER_SHAPE} model.norm_first=true model.attention_dropout=0.1 model.relu_dropout=0.1 "
    "train.peak_lr=0.001 train.warmup=1000",
    "base-pre-reg": f"{PAPER_SHAPE} model.norm_first=true model.attention_dropout=0.2 model.relu_dropout=0.2 "
    "train.label_smoothing=0.2 train.peak_lr=0.001 train.warmup=1000",
    # the paper's post-norm, with the same inner dropout, at the rate post-norm trained at before
    "base-post": f"{PAPER_SHAPE} model.attention_dropout=0.1 model.relu_dropout=0.1 train.peak_lr=0.0007 "
    "train.warmup=1000",
}
ENSEMBLE = ("recipe", "recipe-seed2", "recipe-seed3")
ALPHAS = (0.6, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)  # length penalties tried on val, all from one beam search
AVERAGES = (3, 5)  # the means of the last K checkpoints that compete with best/
CPU_RECIPE_FINAL_GREEDY_VAL_BLEU = 38.74  # bench/results/2026-11-27-multi30k-de-en-repro.json, update 5350
QUICK = [  # 5 updates, outputs of 5 tokens at most: only that every step runs, averages and the ensemble included
    *("train.max_steps=5", "train.eval_every=5", "train.save_every=1", "train.keep_last=5"),
    *("train.eval_sentences=4", "decode.max_len_a=0", "decode.max_len_b=5", "tokenizer.vocab_size=1000"),
]
QUICK_ALPHAS = (1.0, 3.0)
GPU = [  # the early stop (patience) or --minutes ends a run; validation during training kept to a few percent
    *("train.max_steps=20000", "train.eval_every=500", "train.eval_sentences=400", "decode.batch_tokens=16384"),
]


def variant_args(quick: bool) -> list[str]:
    """``--variant`` and ``--ensemble`` arguments for bench.recipe_search: all VARIANTS, or with ``quick`` the
    ensemble's (the CPU recipe's seeds)."""
    chosen = [(name, sets) for name, sets in VARIANTS.items() if name in ENSEMBLE or not quick]
    return [a for name, sets in chosen for a in ("--variant", f"{name} {sets}".strip())] + [
        "--ensemble",
        ",".join(ENSEMBLE),
    ]


def plot_curves(results: dict[str, dict], path: Path) -> Path | None:
    """Greedy val BLEU against wall-clock seconds, a panel per direction and a line per run (None without
    matplotlib: the curves are in the JSON too)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("curves not drawn: matplotlib is not installed (pip install -e '.[plot]'); they are in the JSON")
        return None
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (direction, result) in zip(axes[0], results.items()):
        for name, run in result["runs"].items():
            if run.get("greedy_val_bleu_by_second"):
                seconds, bleu = zip(*run["greedy_val_bleu_by_second"])
                ax.plot(seconds, bleu, marker=".", label=name)
        ax.set(title=direction, xlabel="seconds since the start", ylabel="greedy val BLEU")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="the Multi30k folder (--data-dir of every run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--minutes", type=float, default=5.0, help="training minutes per run at most")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per process")
    p.add_argument("--reach", type=float, default=CPU_RECIPE_FINAL_GREEDY_VAL_BLEU)
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "gpu_recipes")
    p.add_argument("--out", type=Path, required=True, help="folder for the two JSON files and curves.png")
    p.add_argument("--quick", action="store_true", help="the recipe's seeds, 5 updates: checks that it runs")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    common = [a for s in (QUICK if args.quick else GPU) for a in ("--set", s)]
    common += [a for alpha in (QUICK_ALPHAS if args.quick else ALPHAS) for a in ("--alpha", str(alpha))]
    common += [a for k in AVERAGES for a in ("--average", str(k))]

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
        results = dict(zip(DIRECTIONS, pool.map(search, DIRECTIONS)))
    plot_curves(results, args.out / "curves.png")
    return results


if __name__ == "__main__":
    main()
