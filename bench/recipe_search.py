"""Recipe search: variants of one config trained side by side, compared on the validation split.

Each ``--variant`` is a name and the ``--set`` overrides that make it ("dropout02 model.dropout=0.2").
All variants train at once, each a ``tfm train`` process with ``--threads`` OpenMP threads, for at most
``--minutes``. Then each run's ``best/`` and the means of its last K checkpoints (``--average K``, 3 by default)
are translated on the validation split with the config's beam, at every length penalty of ``--alpha`` from one
beam search each (the config's penalty without it), and each run's checkpoint and penalty are chosen on val.
The run chosen on val is written as a checkpoint of its own with its penalty in its config (``<run>.chosen``),
so that ``tfm translate`` uses it. With ``--ensemble A,B,...`` the named runs' checkpoints chosen on val also decode
together as an ensemble, scored on val at the same penalties, and it competes with the best run. With ``--test`` the
one chosen on val, and only that one, is scored on the test split: the search itself never looks at test. Runs
sharing a GPU or CPU slow each other, so their minutes and tokens per second are not what one run alone would take.

    python -m bench.recipe_search --config multi30k-de-en --device cuda --minutes 5.5 --variant recipe \\
        --variant "dropout02 model.dropout=0.2" --alpha 1 --alpha 2 --alpha 3 --average 3 --average 5 \\
        --json bench/results/<date>-<what>.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
from datetime import date
from pathlib import Path

from bench.common import DEFAULT_DATA, ROOT, machine
from transformer import checkpoint

CHOSEN = "chosen"  # the checkpoint chosen on val, with its length penalty, beside the runs: <run>.chosen
ENSEMBLE = "ensemble"  # the name of the --ensemble runs decoding together


def tfm_process(args: list[str], log: Path, threads: int) -> subprocess.Popen:
    """``tfm <args>`` in a process of its own (output to ``log``), from the repository root."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )


def wait_all(procs: dict) -> dict:
    """Wait for every process of ``procs`` (by name); each one's exit code, by the same name."""
    return {name: p.wait() for name, p in procs.items()}


def averaged(runs: Path, name: str, k: int) -> Path:
    """Where ``average`` writes the mean of run ``name``'s last ``k`` checkpoints: beside the runs, ``<name>.avgK``."""
    return runs / f"{name}.avg{k}"


def average(runs: Path, names: list[str], averages: list[int], threads: int) -> dict[tuple[str, int], int]:
    """The mean of each named run's last K checkpoints for every K of ``averages``, all at once (``averaged``); the
    exit code of each (name, K)."""
    return wait_all(
        {
            (n, k): tfm_process(
                ["average", str(runs / n), "--last", str(k), "--output", str(averaged(runs, n, k)), "--overwrite"],
                runs / f"{n}.avg{k}.txt",
                threads,
            )
            for n in names
            for k in averages
        }
    )


def pack_logs(runs: Path, out: Path) -> None:
    """The runs' logs and console output and the score reports (no weights, no hypotheses) as ``out/runs.tgz``."""
    files = [*runs.glob("*.txt"), *runs.glob("*/log.jsonl"), *runs.glob("eval/*/*.json")]
    with tarfile.open(out / "runs.tgz", "w:gz") as tar:
        for path in sorted(files):
            tar.add(path, arcname=str(path.relative_to(runs)))


def run_summary(run: Path, reach: float | None) -> dict:
    """Updates, stop reason, time split, validation curve (by update and by second since the start), lowest
    validation nll of a run's log.jsonl, and the first second its greedy validation BLEU reached ``reach``."""
    entries = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    valid = [e for e in entries if e.get("kind") == "valid"]
    end = next((e for e in entries if e.get("kind") == "end"), {})
    trained = [e["target_tokens_per_s"] for e in entries if e.get("kind") == "train"][-5:]
    return {
        "updates": valid[-1]["step"] if valid else 0,
        "stopped_by": end.get("reason"),
        "minutes": round(end.get("seconds", 0) / 60, 1),
        "minutes_training_validation_checkpoints": [
            round(end.get(k, 0) / 60, 1) for k in ("train_s", "valid_s", "save_s")
        ],
        "validation_share": round(end.get("valid_s", 0) / end["seconds"], 3) if end.get("seconds") else None,
        "target_tokens_per_s": round(sum(trained) / len(trained)) if trained else None,
        "greedy_val_bleu": {e["step"]: e["valid_bleu"] for e in valid},
        "greedy_val_bleu_by_second": [[round(e["elapsed_s"], 1), e["valid_bleu"]] for e in valid],
        "valid_nll_lowest": min((round(e["valid_nll"], 3), e["step"]) for e in valid) if valid else None,
        "seconds_to_reach": next((round(e["elapsed_s"], 1) for e in valid if e["valid_bleu"] >= reach), None)
        if reach is not None
        else None,
    }


def _scores(folder: Path) -> dict[float, dict]:
    """The scores ``tfm eval --output-dir folder`` wrote, by length penalty (none if it wrote none)."""
    keys = ("bleu", "bleu_lc", "chrf", "beam", "alpha", "bleu_signature", "bleu_lc_signature")
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return {r["alpha"]: {k: r[k] for k in keys} for r in reports}


def evaluate(
    runs: Path,
    checkpoints: dict[str, Path | list[Path]],
    split: str,
    data: str,
    device: str,
    threads: int,
    alphas: list[float],
) -> dict[str, dict[float, dict]]:
    """Score each named checkpoint (or ensemble: a list of them) on ``split`` ("valid" or "test": its config names
    them), all at once, at every length penalty of ``alphas`` (the config's if empty), each from one beam search."""
    procs = {}
    (runs / "eval").mkdir(exist_ok=True)
    for name, given in checkpoints.items():
        paths = given if isinstance(given, list) else [given]
        which = ["--split", checkpoint.read_config(paths[0]).data.valid_split] if split == "valid" else []
        args = ["eval", *[a for path in paths for a in ("--checkpoint", str(path))], *which]
        args += ["--data-dir", data, "--device", device, "--overwrite"]
        args += [a for alpha in alphas for a in ("--alpha", str(alpha))]
        procs[name] = tfm_process(
            [*args, "--output-dir", str(runs / "eval" / f"{name}.{split}")], runs / f"{name}.{split}.txt", threads
        )
    wait_all(procs)
    return {name: _scores(runs / "eval" / f"{name}.{split}") for name in checkpoints}


def choose(scored: dict[str, dict[float, dict]]) -> tuple[str, float, float] | None:
    """(checkpoint, alpha, BLEU) with the highest BLEU; the first in order among equals (as max keeps it)."""
    found = [(ck, alpha, s["bleu"]) for ck, by_alpha in scored.items() for alpha, s in by_alpha.items()]
    return max(found, key=lambda f: f[2], default=None)


def write_chosen(source: Path, alpha: float, out: Path, why: dict) -> Path:
    """``source`` again as ``out`` with ``alpha`` as its decode.alpha, so that tfm translate and eval use it."""
    loaded = checkpoint.load(source)
    cfg = dataclasses.replace(loaded.cfg, decode=dataclasses.replace(loaded.cfg.decode, alpha=alpha))
    meta = {**loaded.meta, "chosen_on_val": why}
    return checkpoint.save(out, cfg, loaded.tokenizer, loaded.model, meta)


def _direction_choice(best_run: dict, ensemble: dict | None) -> dict:
    """The ensemble (with the tfm translate command that decodes it) when its val BLEU beats the best run's, else the
    best run; a tie goes to the single run, which decodes at a fraction of the cost."""
    together = (ensemble or {}).get("chosen_on_val")
    if not together or together["bleu"] <= best_run["bleu"]:
        return dict(best_run)
    members = " ".join(f"--checkpoint {m}" for m in ensemble["members"])
    command = f"tfm translate {members} --alpha {together['alpha']:g}"
    return {"run": ENSEMBLE, **together, "members": ensemble["members"], "translate": command}


def search(
    config: str,
    named: dict[str, list[str]],
    data: str,
    runs: Path,
    device: str,
    minutes: float,
    threads: int,
    common: list[str],
    test: bool,
    reach: float | None = None,
    alphas: list[float] | None = None,
    averages: list[int] | None = None,
    ensemble: list[str] | None = None,
) -> dict:
    """Train every variant (name: its overrides) side by side; choose each one's checkpoint and length penalty on
    val; write the best run's choice as ``<name>.chosen``; score the ``ensemble`` runs' choices decoding together on
    val; and, if ``test``, score on test whichever of the best run and the ensemble val chose."""
    alphas, averages = alphas or [], averages or [3]
    runs.mkdir(parents=True, exist_ok=True)
    train = {
        name: tfm_process(
            [
                *("train", "--config", config, "--data-dir", data, "--quiet", "--overwrite"),
                *[
                    a
                    for s in [f"name={name}", f"run_dir={runs}", f"device={device}", f"train.max_minutes={minutes}"]
                    + common
                    + sets
                    for a in ("--set", s)
                ],
            ],
            runs / f"{name}.train.txt",
            threads,
        )
        for name, sets in named.items()
    }
    exit_codes = wait_all(train)
    trained = [n for n in named if exit_codes[n] == 0]
    codes = average(runs, trained, averages, threads)
    checkpoints = {(n, "best"): runs / n / "best" for n in trained}
    checkpoints |= {(n, f"avg{k}"): averaged(runs, n, k) for (n, k), code in codes.items() if code == 0}
    val = evaluate(runs, {f"{n}.{ck}": p for (n, ck), p in checkpoints.items()}, "valid", data, device, threads, alphas)
    result = {
        "config": config,
        "device": device,
        "minutes": minutes,
        "threads": threads,
        "common": common,
        "alphas": alphas,
        "averages": averages,
        "reach": reach,
        "runs": {},
    }
    choices = {}
    for name, sets in named.items():
        entry = {"set": sets, "exit_code": exit_codes[name]}
        if name in trained:
            entry |= run_summary(runs / name, reach)
            scored = {ck: val[f"{n}.{ck}"] for (n, ck) in checkpoints if n == name}
            entry["val"] = {ck: {str(alpha): s for alpha, s in by_alpha.items()} for ck, by_alpha in scored.items()}
            if chosen := choose(scored):
                choices[name] = chosen
                entry["chosen_on_val"] = dict(zip(("checkpoint", "alpha", "bleu"), chosen))
        result["runs"][name] = entry
    members = [checkpoints[(n, choices[n][0])] for n in ensemble or [] if n in choices]
    if ensemble and len(members) == len(ensemble):
        scored = evaluate(runs, {ENSEMBLE: members}, "valid", data, device, threads, alphas)[ENSEMBLE]
        result[ENSEMBLE] = {"members": [str(m) for m in members], "val": {str(a): s for a, s in scored.items()}}
        if together := choose({ENSEMBLE: scored}):
            result[ENSEMBLE]["chosen_on_val"] = {"alpha": together[1], "bleu": together[2]}
    if choices:
        name = max(choices, key=lambda n: choices[n][2])
        ck, alpha, bleu = choices[name]
        why = {"run": name, "checkpoint": ck, "alpha": alpha, "bleu": bleu}
        path = write_chosen(checkpoints[(name, ck)], alpha, runs / f"{name}.{CHOSEN}", why)
        result["best_run_on_val"] = {**why, "path": str(path)}
        result["chosen_on_val"] = _direction_choice(result["best_run_on_val"], result.get(ENSEMBLE))
        if test:
            chosen = result["chosen_on_val"]
            given, at = (members, [chosen["alpha"]]) if chosen["run"] == ENSEMBLE else (path, [])
            scored = evaluate(runs, {f"{chosen['run']}.{CHOSEN}": given}, "test", data, device, threads, at)
            chosen["test"] = next(iter(scored[f"{chosen['run']}.{CHOSEN}"].values()), None)
    return result


def _table(result: dict) -> str:
    rows = [
        f"variant              updates  minutes  val share  chosen on val (checkpoint, alpha: BLEU)  "
        f"seconds to {result['reach']}"
    ]
    for name, r in result["runs"].items():
        if "val" not in r:
            rows.append(f"{name:20} training failed (exit {r['exit_code']})")
            continue
        c = r.get("chosen_on_val")
        chosen = f"{c['checkpoint']}, {c['alpha']:g}: {c['bleu']:.2f}" if c else "-"
        share = f"{r['validation_share']:.0%}" if r["validation_share"] is not None else "-"
        rows.append(
            f"{name:20} {r['updates']:7}  {r['minutes']:7}  {share:>9}  {chosen:39}  {r['seconds_to_reach'] or '-'}"
        )
    together = result.get(ENSEMBLE, {}).get("chosen_on_val")
    if together:
        rows.append(
            f"{'ensemble':20} of {len(result[ENSEMBLE]['members'])} runs' choices at alpha {together['alpha']:g}: "
            f"{together['bleu']:.2f}"
        )
    chosen = result.get("chosen_on_val")
    if chosen:
        test = chosen.get("test")
        where = chosen.get("translate") or f"{chosen['run']}/{chosen['checkpoint']} in {chosen['path']}"
        rows.append(
            f"chosen on val: {where} at alpha {chosen['alpha']:g}"
            + (
                f"; test BLEU {test['bleu']:.2f} (lowercased {test['bleu_lc']:.2f}), chrF {test['chrf']:.2f}"
                if test
                else ""
            )
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a shipped config's name or a YAML path")
    p.add_argument(
        "--variant",
        action="append",
        required=True,
        help="'name key=value ...': a run with these --set overrides (repeatable)",
    )
    p.add_argument("--set", action="append", default=[], dest="common", help="an override for every variant")
    p.add_argument("--data", default=DEFAULT_DATA, help="corpus folder (--data-dir of each run)")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "recipe_search", help="where the runs go")
    p.add_argument("--device", default="auto")
    p.add_argument("--minutes", type=float, default=20.0, help="training minutes per run at most")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per process")
    p.add_argument(
        "--alpha",
        type=float,
        action="append",
        default=[],
        dest="alphas",
        help="a length penalty to "
        "score on val (repeatable; all from one beam search a checkpoint; default: the config's)",
    )
    p.add_argument(
        "--average",
        type=int,
        action="append",
        dest="averages",
        help="also score the mean of the last K checkpoints of each run (repeatable; default: 3)",
    )
    p.add_argument(
        "--ensemble", help="'A,B,...': these variants' checkpoints chosen on val also decode together as an ensemble"
    )
    p.add_argument("--test", action="store_true", help="score the one chosen on val on the test split")
    p.add_argument("--json", type=Path, help="write the result here too")
    p.add_argument("--reach", type=float, help="report the first second each run's greedy val BLEU reached this")
    args = p.parse_args(argv)
    named = {v.split()[0]: v.split()[1:] for v in args.variant if v.split()}
    if len(named) != len(args.variant):
        p.error("each --variant needs a name of its own")
    ensemble = args.ensemble.split(",") if args.ensemble else None
    if ensemble and (len(ensemble) < 2 or set(ensemble) - set(named)):
        p.error("--ensemble names two or more of the --variant runs, separated by commas")
    result = search(
        args.config,
        named,
        args.data,
        args.runs,
        args.device,
        args.minutes,
        args.threads,
        args.common,
        args.test,
        args.reach,
        args.alphas,
        args.averages,
        ensemble,
    )
    result = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "command": "python -m bench.recipe_search " + " ".join(sys.argv[1:] if argv is None else argv),
        **result,
    }
    print(_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
