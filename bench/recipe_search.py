"""Recipe search: variants of one config trained side by side, compared on the validation split.

Each ``--variant`` is a name and the ``--set`` overrides that make it ("dropout02 model.dropout=0.2").
All variants train at once, each a ``tfm train`` process with ``--threads`` OpenMP threads, for at most
``--minutes``; then each run's ``best/`` and the mean of its last 3 checkpoints are translated and
scored on the validation split with the config's beam and length penalty. With ``--test``, the run
and checkpoint with the highest validation BLEU, and only that one, are scored on the test split:
the search itself never looks at test. Runs sharing a GPU or CPU slow each other, so their minutes
and tokens per second are not what one run alone would take.

    python -m bench.recipe_search --config multi30k-de-en --device cuda --minutes 5.5 --variant recipe \\
        --variant "dropout02 model.dropout=0.2" --variant "bpe4k tokenizer.vocab_size=4000" \\
        --json bench/results/<date>-<what>.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

from bench.common import DEFAULT_DATA, ROOT, machine
from transformer.checkpoint import read_config

AVERAGED = 3  # checkpoints in the mean that competes with best/
AVG = f"avg{AVERAGED}"  # its folder in each run


def _tfm(args: list[str], log: Path, threads: int) -> subprocess.Popen:
    """``tfm <args>`` in a process of its own (output to ``log``), from the repository root."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )


def _wait(procs: dict[str, subprocess.Popen]) -> dict[str, int]:
    return {name: p.wait() for name, p in procs.items()}


def _log(run: Path, reach: float | None) -> dict:
    """Updates, stop reason, time split, validation curve (by update and by minute since the start), lowest
    validation nll of a run's log.jsonl, and the first minute its greedy validation BLEU reached ``reach``."""
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
        "target_tokens_per_s": round(sum(trained) / len(trained)) if trained else None,
        "greedy_val_bleu": {e["step"]: e["valid_bleu"] for e in valid},
        "greedy_val_bleu_by_minute": [[round(e["elapsed_s"] / 60, 2), e["valid_bleu"]] for e in valid],
        "valid_nll_lowest": min((round(e["valid_nll"], 3), e["step"]) for e in valid) if valid else None,
        "minutes_to_reach": next((round(e["elapsed_s"] / 60, 2) for e in valid if e["valid_bleu"] >= reach), None)
        if reach is not None
        else None,
    }


def _score(folder: Path) -> dict | None:
    """The scores ``tfm eval --output-dir folder`` wrote, or None if it wrote none."""
    found = sorted(folder.glob("*.json"))
    if not found:
        return None
    result = json.loads(found[0].read_text())
    keys = ("bleu", "bleu_lc", "chrf", "beam", "alpha", "bleu_signature", "bleu_lc_signature")
    return {k: result[k] for k in keys}


def _evaluate(
    runs: Path, pairs: list[tuple[str, str]], split: str, data: str, device: str, threads: int
) -> dict[tuple[str, str], dict | None]:
    """Score each (run, checkpoint) on ``split`` ("valid" or "test": the run's config names them), all at once."""
    procs = {}
    for name, ck in pairs:
        which = ["--split", read_config(runs / name / ck).data.valid_split] if split == "valid" else []
        procs[(name, ck)] = _tfm(
            [
                "eval",
                "--checkpoint",
                str(runs / name / ck),
                *which,
                "--data-dir",
                data,
                "--device",
                device,
                "--output-dir",
                str(runs / name / f"eval-{ck}-{split}"),
            ],
            runs / f"{name}.{ck}.{split}.txt",
            threads,
        )
    _wait(procs)
    return {pair: _score(runs / pair[0] / f"eval-{pair[1]}-{split}") for pair in pairs}


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
) -> dict:
    """Train every variant (name: its overrides) side by side, score each on val, the best one on test if ``test``."""
    runs.mkdir(parents=True, exist_ok=True)
    train = {
        name: _tfm(
            [
                "train",
                "--config",
                config,
                "--data-dir",
                data,
                "--quiet",
                "--overwrite",
                *[
                    a
                    for s in [
                        f"name={name}",
                        f"run_dir={runs}",
                        f"device={device}",
                        f"train.max_minutes={minutes}",
                        *common,
                        *sets,
                    ]
                    for a in ("--set", s)
                ],
            ],
            runs / f"{name}.train.txt",
            threads,
        )
        for name, sets in named.items()
    }
    exit_codes = _wait(train)
    trained = [n for n in named if exit_codes[n] == 0]
    averaged = {
        n: _tfm(
            ["average", str(runs / n), "--last", str(AVERAGED), "--output", str(runs / n / AVG), "--overwrite"],
            runs / f"{n}.average.txt",
            threads,
        )
        for n in trained
    }
    averaged = _wait(averaged)
    pairs = [(n, "best") for n in trained] + [(n, AVG) for n in trained if averaged[n] == 0]
    val = _evaluate(runs, pairs, "valid", data, device, threads)
    result = {
        "config": config,
        "device": device,
        "minutes": minutes,
        "threads": threads,
        "common": common,
        "reach": reach,
        "runs": {},
    }
    for name, sets in named.items():
        entry = {"set": sets, "exit_code": exit_codes[name]}
        if name in trained:
            entry |= _log(runs / name, reach)
            entry["val"] = {ck: val.get((name, ck)) for ck in ("best", AVG)}
        result["runs"][name] = entry
    scored = [(s["bleu"], pair) for pair, s in val.items() if s]
    if scored:
        name, ck = max(scored)[1]
        result["chosen_on_val"] = {"run": name, "checkpoint": ck}
        if test:
            result["chosen_on_val"]["test"] = _evaluate(runs, [(name, ck)], "test", data, device, threads)[(name, ck)]
    return result


def _table(result: dict) -> str:
    rows = [f"variant              updates  minutes  val best/  val {AVG}  minutes to reach {result['reach']}"]
    for name, r in result["runs"].items():
        if "val" not in r:
            rows.append(f"{name:20} training failed (exit {r['exit_code']})")
            continue
        bleu = [f"{s['bleu']:.2f}" if s else "-" for s in r["val"].values()]
        rows.append(
            f"{name:20} {r['updates']:7}  {r['minutes']:7}  {bleu[0]:>9}  {bleu[1]:>8}  {r['minutes_to_reach'] or '-'}"
        )
    chosen = result.get("chosen_on_val")
    if chosen:
        rows.append(
            f"chosen on val: {chosen['run']}/{chosen['checkpoint']}"
            + (
                f"; test BLEU {chosen['test']['bleu']:.2f} (lowercased {chosen['test']['bleu_lc']:.2f}), "
                f"chrF {chosen['test']['chrf']:.2f}"
                if chosen.get("test")
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
    p.add_argument("--test", action="store_true", help="score the one chosen on val on the test split")
    p.add_argument("--json", type=Path, help="write the result here too")
    p.add_argument("--reach", type=float, help="report the first minute each run's greedy val BLEU reached this")
    args = p.parse_args(argv)
    named = {v.split()[0]: v.split()[1:] for v in args.variant if v.split()}
    if len(named) != len(args.variant):
        p.error("each --variant needs a name of its own")
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
