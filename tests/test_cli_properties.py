"""The command line under generated input: whatever paths, numbers, devices, settings and sentences a user types, `tfm`
answers with an exit code from the documented set (0 done, 2 refused), never a traceback, and changes no file
but the ones the command says it writes. Around the command: folders of the user's at output paths and run names,
a run held by another process, a checkpoint whose weights hold NaN, and the full disk of /dev/full."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tiny import SAMPLE
from typer.testing import CliRunner

from cli.main import app
from transformer.manifest import MANIFEST
from transformer.training.run_dir import locked

EXIT_CODES = {0, 2}

# Places a user may name, each wrong in its own way: relative to a fresh workspace.
PATHS = [
    "in.de",
    "missing.de",
    "folder",
    "nofolder/out.en",
    "exists.en",
    "out.en",
    "runs/tiny/checkpoints/step_6",
    "runs/tiny",
    "runs/tiny/best",
    "out_dir",
    "/dev/full",
    "/dev/null",
    "/dev/zero",
    "runs/tiny/../in.de",
    "./in.de",
]
NUMBERS = ["-1", "0", "1", "2", "5", "100000", "x"]
ALPHAS = ["0", "0.6", "-1", "nan", "inf", "x"]
DEVICES = ["cpu", "CPU", "gpu", "cuda", "cuda:7", "meta", "auto", ""]
PRECISIONS = ["fp32", "bf16", "fp16", "fp8", ""]
DEVICES_NAMED = [p for p in PATHS if p.startswith("/dev/")]  # never to be replaced, whatever the command
USERS = ["exists.en", "folder/mine.txt", "runs/thesis/ch1.tex"]  # the user's own files: never changed or deleted
HELD = "runs/held"  # a run another tfm train holds while the command runs
NAN = "runs/nan/best"  # a checkpoint with a NaN weight: refused by every command that loads it
QUICK = [
    "--set",
    f"data.path={SAMPLE}",
    "--set",
    "train.max_steps=2",
    "--set",
    "train.eval_every=2",
    "--set",
    "train.eval_sentences=4",
]
sentences = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)


def option(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    """``[name, value]``, or more often nothing, so that some command lines are good ones."""
    return st.one_of(st.just([]), st.just([]), st.just([]), values.map(lambda v: [name, v]))


def command() -> st.SearchStrategy[list[str]]:
    path = st.sampled_from(PATHS)
    ckpt = option(
        "--checkpoint", st.sampled_from(["runs/tiny/best", "runs/tiny/checkpoints/step_6", "missing", "in.de", NAN])
    )
    common = [ckpt, option("--device", st.sampled_from(DEVICES)), option("--precision", st.sampled_from(PRECISIONS))]
    translate = st.tuples(
        st.just(["translate"]),
        st.one_of(st.just([]), sentences.map(lambda s: [s])),
        option("--input", path),
        option("--output", path),
        option("--beam", st.sampled_from(NUMBERS)),
        option("--nbest", st.sampled_from(NUMBERS)),
        option("--batch-tokens", st.sampled_from(NUMBERS)),
        option("--alpha", st.sampled_from(ALPHAS)),
        st.sampled_from([[], ["--greedy"], ["--overwrite"]]),
        *common,
    )
    eval_ = st.tuples(
        st.just(["eval"]),
        option("--src", path),
        option("--ref", path),
        option("--hyp", path),
        option("--beam", st.sampled_from(NUMBERS)),
        option("--alpha", st.sampled_from(ALPHAS)),
        option("--output-dir", path),
        option("--data-dir", path),
        *common,
    )
    average = st.tuples(
        st.just(["average"]),
        st.sampled_from(["runs/tiny", "missing", "in.de"]).map(lambda p: [p]),
        option("--last", st.sampled_from(NUMBERS)),
        option("--output", path),
        st.sampled_from([[], ["--overwrite"]]),
    )
    attention = st.tuples(
        st.just(["attention"]),
        sentences.map(lambda s: [s]),
        option("--layer", st.sampled_from(NUMBERS)),
        option("--head", st.sampled_from(NUMBERS + ["all"])),
        option("--output", path),
        ckpt,
        st.sampled_from([[], ["--overwrite"]]),
    )
    export = st.tuples(
        st.just(["export"]),
        st.sampled_from(["runs/tiny/best", "missing", NAN]).map(lambda p: ["--checkpoint", p]),
        st.sampled_from(PATHS).map(lambda p: ["--output", p]),
        st.sampled_from([[], ["--overwrite"]]),
    )
    plot = st.tuples(
        st.just(["plot"]),
        st.sampled_from(["runs/tiny", "missing", "in.de"]).map(lambda p: [p]),
        option("--output", path),
        st.sampled_from([[], ["--overwrite"]]),
    )
    settings_ = st.lists(
        st.sampled_from(
            [
                "name=q",
                "name=q",
                "run_dir=runs",
                "name=tiny",
                "name=thesis",
                "name=held",
                "name=../x",
                "name=a/b",
                "run_dir=in.de/sub",
                "run_dir=out_dir",
                "train.max_steps=0",
                "train.lerning_rate=1",
                "device=gpu",
                "precision=fp8",
                "model.h=3",
            ]
        ),
        max_size=2,
    )
    train = st.tuples(
        st.just(["train"]),
        st.sampled_from(["quickstart"] * 4 + ["missing.yaml", "in.de", "folder"]).map(
            lambda c: ["--config", c, "--quiet", *QUICK]
        ),
        settings_.map(lambda sets: [a for v in sets for a in ("--set", v)]),
        st.sampled_from([[], ["--resume"], ["--overwrite"], ["--resume", "--overwrite"]]),
    )
    return st.one_of(translate, eval_, average, attention, export, plot, train).map(lambda parts: sum(parts, []))


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def allowed(args: list[str]) -> list[str]:
    """The paths (relative to the workspace) a command may create or change: its outputs, nothing else."""
    named = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    outputs = [named[k] for k in ("--output", "--output-dir") if k in named]
    if args[0] == "eval" and "--output-dir" not in named:
        outputs.append(f"{named.get('--checkpoint', 'runs/tiny/best')}/eval")
    if args[0] == "average" and "--output" not in named:
        outputs.append(f"{args[1]}/avg{named.get('--last', '5')}")
    if args[0] == "plot" and "--output" not in named:
        outputs += [f"{args[1]}/training.png", f"{args[1]}/{MANIFEST}"]  # the picture, recorded as tfm's
    if args[0] == "train":
        sets = dict(args[i + 1].split("=", 1) for i in range(len(args) - 1) if args[i] == "--set")
        run_dir = sets.get("run_dir", "runs")
        outputs += [f"{run_dir}/{sets.get('name', 'quickstart')}", f"{run_dir}/.cache"]  # the run; the token cache
    if args[0] == "attention" and "--output" not in named:
        outputs.append("attention.png")
    return [os.path.normpath(o) for o in outputs]


def workspace(run: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="tfm-cli-"))
    shutil.copytree(run, root / "runs/tiny")
    shutil.copytree(run, root / HELD)
    shutil.copytree(run / "best", root / NAN)
    weights = load_file(root / NAN / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].clone().index_fill_(0, torch.tensor([0]), float("nan"))
    save_file(weights, root / NAN / "model.safetensors")
    shutil.copy(SAMPLE / "valid.de", root / "in.de")
    for user in USERS:
        (root / user).parent.mkdir(parents=True, exist_ok=True)
        (root / user).write_text("the user's own file\n", encoding="utf-8")
    return root


def loads_nan_weights(args: list[str]) -> bool:
    """Whether the command reads the NaN checkpoint's weights (eval --hyp scores a file and reads only the config)."""
    named = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    return (
        named.get("--checkpoint") == NAN
        and args[0] in ("translate", "eval", "attention", "export")
        and ("--hyp" not in named)
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=command())
# a folder of the user's at --output, with --overwrite: found once by chance, now tried on every run
@example(args=["export", "--checkpoint", "runs/tiny/best", "--output", "folder", "--overwrite"])
@example(args=["average", "runs/tiny", "--last", "1", "--output", "folder", "--overwrite"])
def test_any_command_line_ends_in_a_documented_exit_code_and_writes_only_its_outputs(tiny_run, monkeypatch, args):
    root = workspace(tiny_run.run_dir)
    try:
        monkeypatch.chdir(root)
        before = snapshot(root)
        with locked(root / HELD):
            result = CliRunner().invoke(app, args, input="Ein Hund läuft.\n", env={"TFM_SHARED_CPU": "1"})
        event(f"{args[0]} exit {result.exit_code}")  # --hypothesis-show-statistics shows the mix
        assert result.exit_code in EXIT_CODES, (args, result.output, result.exception)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
        assert "Traceback" not in result.output
        after = snapshot(root)
        outputs = allowed(args)
        changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
        stray = {p for p in changed if not any(p == o or p.startswith(o.rstrip("/") + "/") for o in outputs)}
        assert not stray, (args, stray)
        assert after.get("exists.en") == before["exists.en"] or "--overwrite" in args, args
        assert all(after.get(u) == before[u] for u in USERS[1:]), args  # never, not even with --overwrite
        assert not any(p.startswith(HELD + "/") for p in changed), args  # nor a run another process holds
        assert result.exit_code == 2 or not loads_nan_weights(args), (args, result.output)
        assert all(stat.S_ISCHR(os.stat(d).st_mode) for d in DEVICES_NAMED if os.path.exists(d)), args
    finally:
        shutil.rmtree(root, ignore_errors=True)
