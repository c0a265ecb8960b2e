"""Multi30k's multilingual models and their fine-tunes on one GPU, in one call: the figures of docs/multilingual.md.

Stage 1 trains the PARENTS side by side for ``--minutes`` each: one model for the six directions between English and
de, fr, cs, at the recipe's shape and wider, in batches of 4,096 and 16,384 tokens; one for the three into English;
one for the three out of it. Stage 2 starts a run from each parent's ``best/`` (``--init``) on de->en alone and on
en->de alone (FINE_TUNES) for ``--fine-tune-minutes``, while the parents are scored. Every model's ``best/`` and the
mean of its last 3 checkpoints translate val and test with beam 5 at each length penalty of ALPHAS (one beam search
each). A multilingual model's checkpoint is chosen on its mean val BLEU over its directions and each direction's
penalty on val; a fine-tune's checkpoint and penalty on val; then, for each direction, the run val chose. Test is
read only where val chose. The six-direction parents also translate de->fr, which no pair trained (zero-shot).
What each run and choice scored goes to ``<out>/gpu-multilingual.json`` after each stage, the runs' logs and
reports to ``<out>/runs.tgz``.

    python -m bench.gpu_multilingual --data data/multi30k --out $OUT          # on the GPU, about 9 minutes
    python -m bench.gpu_multilingual --device cpu --quick --out /tmp/m        # checks it runs (pytest -m slow)
    python -m bench.gpu_multilingual --parents six-wide-b16k --minutes 6 --out $OUT   # one parent, longer
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import torch

from bench.common import DEFAULT_DATA, ROOT, machine
from bench.recipe_search import average, averaged, pack_logs, run_summary, tfm_process, wait_all
from transformer import checkpoint

CONFIG = "multi30k-multilingual"
SIX = "data.directions=[de-en,fr-en,cs-en,en-de,en-fr,en-cs]"
WIDE = ["model.d_model=512", "model.d_ff=2048", "model.h=8"]  # the en->de GPU recipe's width
B16K = ["train.batch_tokens=16384"]  # four times the recipe's batch: a small model leaves most of a GPU idle
PARENTS = {
    "six": [SIX],
    "six-b16k": [SIX, *B16K],
    "six-wide-b16k": [SIX, *WIDE, *B16K],
    "x-en-b16k": ["data.directions=[de-en,fr-en,cs-en]", *B16K],
    "en-x-wide-b16k": ["data.directions=[en-de,en-fr,en-cs]", *WIDE, *B16K],
}
FINE_TUNES = {
    "de-en": ("six", "six-b16k", "six-wide-b16k", "x-en-b16k"),
    "en-de": ("six", "six-b16k", "six-wide-b16k", "en-x-wide-b16k"),
}
FINE_TUNE = ["train.warmup=200"]  # a fresh schedule with a short warm-up, as docs/multilingual.md's CPU fine-tune
ZERO_SHOT = ("de", "fr")
ALPHAS = (1.0, 2.0, 3.0, 4.0)
AVERAGE = 3
GPU = [  # time (--minutes) ends a run; validation greedy on 200 sentences a direction, a small share of each run
    *("train.max_steps=100000", "train.eval_every=500", "train.eval_sentences=200", "train.save_every=500"),
    *("train.keep_last=10", "train.patience=100", "decode.batch_tokens=16384"),
]
QUICK = [  # 4 updates, outputs of 5 tokens at most: only that every stage runs
    *("train.max_steps=4", "train.eval_every=2", "train.save_every=1", "train.keep_last=5"),
    *("train.eval_sentences=4", "decode.max_len_a=0", "decode.max_len_b=5", "tokenizer.vocab_size=300"),
]
QUICK_PARENTS = ("six", "x-en-b16k")
QUICK_ALPHAS = (1.0, 3.0)


def _train(name: str, sets: list[str], minutes: float, runs: Path, args: argparse.Namespace) -> subprocess.Popen:
    """``tfm train`` of CONFIG with ``sets`` for at most ``minutes``, in a process of its own."""
    overrides = [f"name={name}", f"run_dir={runs}", f"device={args.device}", f"train.max_minutes={minutes}"]
    overrides += [*(QUICK if args.quick else GPU), *sets]
    command = ["train", "--config", CONFIG, "--data-dir", args.data, "--quiet", "--overwrite"]
    return tfm_process(command + [a for s in overrides for a in ("--set", s)], runs / f"{name}.train.txt", args.threads)


def _candidates(name: str, runs: Path) -> dict[str, Path]:
    """A run's checkpoints that compete on val: best/ and the mean of its last AVERAGE, where they exist."""
    found = {"best": runs / name / "best", f"avg{AVERAGE}": averaged(runs, name, AVERAGE)}
    return {ck: path for ck, path in found.items() if (path / checkpoint.META).is_file()}


def _score(name: str, ck: str, path: Path, runs: Path, args: argparse.Namespace, zero_shot: bool) -> None:
    """Translate val and test (and the zero-shot direction) with ``path``, one report per direction and alpha."""
    cfg = checkpoint.read_config(path)
    alphas = QUICK_ALPHAS if args.quick else ALPHAS
    for split in (cfg.data.valid_split, cfg.data.test_split):
        command = ["eval", "--checkpoint", str(path), "--split", split, "--data-dir", args.data]
        command += ["--device", args.device, "--overwrite", "--output-dir", str(runs / "eval" / f"{name}.{ck}")]
        command += [a for alpha in alphas for a in ("--alpha", str(alpha))]
        extra = [["--from", ZERO_SHOT[0], "--to", ZERO_SHOT[1]]] if zero_shot else []
        for i, more in enumerate([[], *extra]):
            tfm_process(command + more, runs / f"{name}.{ck}.{split}.{i}.txt", args.threads).wait()


def _score_all(jobs: list[tuple[str, bool]], runs: Path, args: argparse.Namespace) -> None:
    """Score every candidate checkpoint of the named runs at once (``True`` beside a name: the zero-shot direction
    too), each checkpoint's splits in turn."""
    tasks = [(n, ck, p, zs) for n, zs in jobs for ck, p in _candidates(n, runs).items()]
    (runs / "eval").mkdir(exist_ok=True)
    with ThreadPoolExecutor(max(1, len(tasks))) as pool:
        list(pool.map(lambda t: _score(t[0], t[1], t[2], runs, args, t[3]), tasks))


def _reports(folder: Path) -> dict[str, dict[str, dict[float, dict]]]:
    """The scores ``tfm eval`` wrote in ``folder``: {split: {direction: {alpha: scores}}}."""
    keys = ("bleu", "bleu_lc", "chrf", "alpha", "bleu_signature")
    found: dict[str, dict[str, dict[float, dict]]] = {}
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        split, direction = report["split"].rsplit(".", 1)
        found.setdefault(split, {}).setdefault(direction, {})[report["alpha"]] = {k: report[k] for k in keys}
    return found


def _choose(
    scored: dict[str, dict[str, dict[str, dict[float, dict]]]], splits: tuple[str, str], directions: list[str]
) -> dict:
    """Of ``scored`` ({checkpoint: its reports}), the checkpoint with the highest mean val BLEU over ``directions``
    (each at its best penalty on val), then every direction it was scored on (a zero-shot one too) at its penalty on
    val with its test scores there; every candidate's val BLEU beside it. ``splits``: the val and test split names."""
    valid, test = splits
    val = {
        ck: {d: {str(a): s["bleu"] for a, s in r.get(valid, {}).get(d, {}).items()} for d in directions}
        for ck, r in scored.items()
    }
    means = {ck: statistics.mean(max(a.values()) for a in v.values()) for ck, v in val.items() if all(v.values())}
    if not means:
        return {"val": val}
    ck = max(means, key=means.__getitem__)
    chosen = {}
    for d, by_alpha in scored[ck].get(valid, {}).items():
        alpha = max(by_alpha, key=lambda a: by_alpha[a]["bleu"])
        chosen[d] = {"alpha": alpha, "val_bleu": by_alpha[alpha]["bleu"], "test": scored[ck][test][d][alpha]}
    return {
        "val": val,
        "chosen_on_val": {"checkpoint": ck, "mean_val_bleu": round(means[ck], 2), "by_direction": chosen},
    }


def _chosen(name: str, runs: Path, directions: list[str]) -> dict:
    """``_choose`` over the reports of a run's candidate checkpoints."""
    cfg = checkpoint.read_config(runs / name / "best")
    scored = {ck: _reports(runs / "eval" / f"{name}.{ck}") for ck in _candidates(name, runs)}
    return _choose(scored, (cfg.data.valid_split, cfg.data.test_split), directions)


def _trained(run: Path, code: int) -> dict:
    """A finished run's updates, minutes and validation curve (nothing for one that failed: its console says why)."""
    return run_summary(run, None) if code == 0 else {}


def _best_by_direction(result: dict) -> dict[str, dict]:
    """For de->en and en->de, the run (parent or fine-tune) with the highest val BLEU there, with its choice."""
    best = {}
    for d in FINE_TUNES:
        found = [
            (run["chosen_on_val"]["by_direction"][d]["val_bleu"], group, name)
            for group in ("parents", "fine_tunes")
            for name, run in result[group].items()
            if d in run.get("chosen_on_val", {}).get("by_direction", {})
        ]
        if found:
            _, group, name = max(found)
            best[d] = {"run": name, **result[group][name]["chosen_on_val"]["by_direction"][d]}
    return best


def _directions(sets: list[str]) -> list[str]:
    listed = next(s for s in sets if s.startswith("data.directions="))
    return listed.split("=", 1)[1].strip("[]").split(",")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="the Multi30k folder (--data-dir of every run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--minutes", type=float, default=4.0, help="training minutes of each parent")
    p.add_argument("--fine-tune-minutes", type=float, default=2.5, help="training minutes of each fine-tune")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per process")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "gpu_multilingual")
    p.add_argument("--out", type=Path, required=True, help="folder for gpu-multilingual.json and runs.tgz")
    p.add_argument("--parents", help="'A,B,...': these of PARENTS only, and their fine-tunes (default: all)")
    p.add_argument("--quick", action="store_true", help="two parents, 4 updates each: checks that it runs")
    args = p.parse_args(argv)
    chosen = args.parents.split(",") if args.parents else list(QUICK_PARENTS if args.quick else PARENTS)
    if unknown := set(chosen) - set(PARENTS):
        p.error(f"--parents: {', '.join(sorted(unknown))} not in {', '.join(PARENTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    parents = {n: s for n, s in PARENTS.items() if n in chosen}
    gpu = torch.cuda.get_device_name() if args.device == "cuda" and torch.cuda.is_available() else None
    result: dict = {
        "date": date.today().isoformat(),
        "machine": {**machine(), "gpu": gpu},
        "command": "python -m bench.gpu_multilingual " + " ".join(sys.argv[1:] if argv is None else argv),
        "minutes": {"parents": args.minutes, "fine_tunes": args.fine_tune_minutes},
        "parents": {},
        "fine_tunes": {},
    }

    def save() -> None:
        (args.out / "gpu-multilingual.json").write_text(json.dumps(result, indent=1) + "\n")
        pack_logs(args.runs, args.out)

    codes = wait_all({n: _train(n, s, args.minutes, args.runs, args) for n, s in parents.items()})
    for n, sets in parents.items():
        result["parents"][n] = {"set": sets, "exit_code": codes[n], **_trained(args.runs / n, codes[n])}
    save()
    trained = [n for n in parents if codes[n] == 0]
    average(args.runs, trained, [AVERAGE], args.threads)
    tunes = {
        f"{d}-from-{n}": [
            *(s for s in parents[n] if s.startswith("model.")),
            f"data.directions=[{d}]",
            f"train.init={args.runs / n / 'best'}",
            *FINE_TUNE,
        ]
        for d, names in FINE_TUNES.items()
        for n in names
        if n in trained
    }
    with ThreadPoolExecutor(1) as scoring:
        parents_scored = scoring.submit(_score_all, [(n, SIX in parents[n]) for n in trained], args.runs, args)
        codes = wait_all({n: _train(n, s, args.fine_tune_minutes, args.runs, args) for n, s in tunes.items()})
        parents_scored.result()
    for n in trained:
        result["parents"][n] |= _chosen(n, args.runs, _directions(parents[n]))
    for n, sets in tunes.items():
        result["fine_tunes"][n] = {"set": sets, "exit_code": codes[n], **_trained(args.runs / n, codes[n])}
    save()
    tuned = [n for n in tunes if codes[n] == 0]
    average(args.runs, tuned, [AVERAGE], args.threads)
    _score_all([(n, False) for n in tuned], args.runs, args)
    for n in tuned:
        result["fine_tunes"][n] |= _chosen(n, args.runs, _directions(tunes[n]))
    result["chosen_on_val"] = _best_by_direction(result)
    save()
    print(json.dumps(result["chosen_on_val"], indent=1))
    return result


if __name__ == "__main__":
    main()
