"""The command line under generated input: whatever paths, numbers, devices, settings and sentences a user types, `tfm`
answers with an exit code from the documented set (0 done, 2 refused), never a traceback, changes no file but the
ones the command says it writes, never changes what it reads, and leaves no temporary file. Around the command, also
drawn: files of the user's at every depth of a run and of an earlier export, outputs spelt as inputs (the same
path, a link, a hard link, a link that loops, /dev/stdin), a run held by another process, a checkpoint whose
weights hold NaN, the full disk of /dev/full and a real full disk (a small tmpfs, where the test may mount one)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import torch
from disks import mount_tmpfs, unmount
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tiny import SAMPLE
from typer.testing import CliRunner

from cli.main import app
from transformer.storage.files import atomic_dir
from transformer.storage.manifest import MANIFEST
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
    "link.de",  # a link to in.de
    "hard.de",  # a hard link to in.de
    "loop",  # a link to itself
    "/dev/stdin",
    "runs/tiny/best/model.safetensors",
    "runs/tiny/log.jsonl",
    "runs/tiny/best",
    "export",  # an earlier export of runs/tiny/best
    "full/out.en",  # on a full disk, where one can be mounted
    "full/out_dir",
]
NUMBERS = ["-1", "0", "1", "2", "5", "100000", "x"]
ALPHAS = ["0", "0.6", "-1", "nan", "inf", "x"]
DEVICES = ["cpu", "CPU", "gpu", "cuda", "cuda:7", "meta", "auto", ""]
PRECISIONS = ["fp32", "bf16", "fp16", "fp8", ""]
LANGUAGES = ["en", "de", "fr", "EN", ">>en<<", ""]
DEVICES_NAMED = [p for p in PATHS if p.startswith("/dev/")]  # never to be replaced, whatever the command
USERS = ["exists.en", "folder/mine.txt", "runs/thesis/ch1.tex"]  # the user's own files: never changed or deleted
# Files of the user's inside folders tfm wrote, at every depth: some are drawn into each workspace.
INSIDE = [
    "runs/tiny/notes.txt",
    "runs/tiny/checkpoints/notes.txt",
    "runs/tiny/checkpoints/step_6/notes.txt",
    "runs/tiny/best/notes.txt",
    "runs/tiny/best/eval/notes.txt",
    "runs/tiny/tensorboard/notes.txt",
    "export/notes.txt",
]
READ = ["in.de", "runs/tiny/best", "runs/tiny/checkpoints", "runs/tiny/log.jsonl"]  # what commands read
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
    path = st.sampled_from([p for p in PATHS if p != "/dev/stdin"])  # reading the test's own stdin could wait
    out = st.sampled_from(PATHS)
    ckpt = option(
        "--checkpoint", st.sampled_from(["runs/tiny/best", "runs/tiny/checkpoints/step_6", "missing", "in.de", NAN])
    )
    common = [ckpt, option("--device", st.sampled_from(DEVICES)), option("--precision", st.sampled_from(PRECISIONS))]
    translate = st.tuples(
        st.just(["translate"]),
        st.one_of(st.just([]), sentences.map(lambda s: [s])),
        option("--input", path),
        option("--output", out),
        option("--beam", st.sampled_from(NUMBERS)),
        option("--nbest", st.sampled_from(NUMBERS)),
        option("--batch-tokens", st.sampled_from(NUMBERS)),
        option("--alpha", st.sampled_from(ALPHAS)),
        st.sampled_from([[], ["--greedy"], ["--overwrite"]]),
        *common,
        option("--to", st.sampled_from(LANGUAGES)),
        option("--prefix", sentences),
        option("--prefix-file", path),
        option("--shortlist", path),
        st.sampled_from([[], ["--sample"], ["--align"], ["--sample", "--align"]]),
        option("--seed", st.sampled_from(NUMBERS)),
        option("--top-k", st.sampled_from(NUMBERS)),
        option("--top-p", st.sampled_from(ALPHAS)),
    )
    score = st.tuples(
        st.just(["score"]),
        st.sampled_from([p for p in PATHS if p != "/dev/stdin"] + ["in.de"] * 8).map(lambda p: ["--src", p]),
        st.sampled_from([p for p in PATHS if p != "/dev/stdin"] + ["hard.de"] * 8).map(lambda p: ["--tgt", p]),
        option("--output", out),
        option("--format", st.sampled_from(["tsv", "jsonl", "x"])),
        option("--alpha", st.sampled_from(ALPHAS)),
        option("--to", st.sampled_from(LANGUAGES)),
        st.sampled_from([[], ["--tokens"], ["--overwrite"]]),
        *common,
    )
    shortlist = st.tuples(
        st.just(["shortlist"]),
        st.sampled_from(["runs/tiny/best", "runs/tiny/best", "missing", "in.de", NAN]).map(
            lambda p: ["--checkpoint", p]
        ),
        st.sampled_from(PATHS).map(lambda p: ["--output", p]),
        option("--src", path),
        option("--tgt", path),
        option("--per-token", st.sampled_from(NUMBERS)),
        option("--max-pairs", st.sampled_from(NUMBERS)),
        option("--data-dir", path),
        st.sampled_from([[], ["--overwrite"]]),
    )
    eval_ = st.tuples(
        st.just(["eval"]),
        option("--src", path),
        option("--ref", path),
        option("--hyp", path),
        option("--beam", st.sampled_from(NUMBERS)),
        option("--alpha", st.sampled_from(ALPHAS)),
        option("--output-dir", out),
        option("--data-dir", path),
        *common,
    )
    average = st.tuples(
        st.just(["average"]),
        st.sampled_from(["runs/tiny", "missing", "in.de"]).map(lambda p: [p]),
        option("--last", st.sampled_from(NUMBERS)),
        option("--output", out),
        st.sampled_from([[], ["--overwrite"]]),
    )
    attention = st.tuples(
        st.just(["attention"]),
        sentences.map(lambda s: [s]),
        option("--layer", st.sampled_from(NUMBERS)),
        option("--head", st.sampled_from(NUMBERS + ["all"])),
        option("--output", out),
        ckpt,
        st.sampled_from([[], ["--overwrite"]]),
    )
    export = st.tuples(
        st.just(["export"]),
        st.sampled_from(["runs/tiny/best", "missing", NAN]).map(lambda p: ["--checkpoint", p]),
        st.sampled_from(PATHS + [".", "full"]).map(lambda p: ["--output", p]),
        st.sampled_from([[], ["--overwrite"]]),
    )
    plot = st.tuples(
        st.just(["plot"]),
        st.sampled_from(["runs/tiny", "missing", "in.de"]).map(lambda p: [p]),
        option("--output", out),
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
                "run_dir=full",
                "train.max_steps=0",
                "train.lerning_rate=1",
                "device=gpu",
                "precision=fp8",
                "model.h=3",
                "data.directions=[de-en, en-de]",
                "data.directions=[de-en, de-en]",
                "data.synthetic=folder",
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
        option(
            "--init", st.sampled_from(["runs/tiny/best", "runs/tiny", "runs/tiny/checkpoints", NAN, "missing", "in.de"])
        ),
    )
    commands = (translate, eval_, average, attention, export, plot, train, score, shortlist)
    return st.one_of(*commands).map(lambda parts: sum(parts, []))


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def _named(args: list[str]) -> dict[str, str]:
    return {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}


def allowed(args: list[str]) -> list[str]:
    """The paths (relative to the workspace) a command may create or change: its outputs, nothing else (an output
    that is in.de or a link or hard link to it is all three: a user who names one with --overwrite asks for that)."""
    named = _named(args)
    outputs = [named[k] for k in ("--output", "--output-dir") if k in named]
    aliases = ["in.de", "link.de", "hard.de"]
    outputs += aliases if any(os.path.normpath(o) in aliases for o in outputs) else []
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


def reads(args: list[str]) -> list[str]:
    """What the command reads that it must leave as it was, whatever its output (train may replace a run)."""
    named = _named(args)
    sources = [
        named[k] for k in ("--input", "--src", "--tgt", "--ref", "--hyp", "--prefix-file", "--shortlist") if k in named
    ]
    read = ["in.de"] if any(os.path.normpath(s) in ("in.de", "link.de", "hard.de") for s in sources) else []
    return read + (READ[1:] if args[0] != "train" else [])


def mount_full(folder: Path) -> bool:
    """A tmpfs at ``folder`` with a few kilobytes left, where this test may mount one; else a plain folder."""
    folder.mkdir()
    if not mount_tmpfs(folder, "256k"):
        return False
    (folder / "filler").write_bytes(b"\0" * (256 * 1024 - 8192))
    return True


def workspace(run: Path, inside: set[str]) -> tuple[Path, bool]:
    """A fresh workspace around the command (and whether ``full`` is a real full disk)."""
    root = Path(tempfile.mkdtemp(prefix="tfm-cli-"))
    shutil.copytree(run, root / "runs/tiny")
    shutil.copytree(run, root / HELD)
    shutil.copytree(run / "best", root / NAN)
    weights = load_file(root / NAN / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].clone().index_fill_(0, torch.tensor([0]), float("nan"))
    save_file(weights, root / NAN / "model.safetensors")
    shutil.copy(SAMPLE / "valid.de", root / "in.de")
    (root / "link.de").symlink_to("in.de")
    os.link(root / "in.de", root / "hard.de")
    (root / "loop").symlink_to("loop")
    with atomic_dir(root / "export", "export") as tmp:  # an earlier export, which --overwrite may replace
        (tmp / "model.bin").write_bytes(b"an export")
    for user in USERS + sorted(inside):
        (root / user).parent.mkdir(parents=True, exist_ok=True)
        (root / user).write_text("the user's own file\n", encoding="utf-8")
    return root, mount_full(root / "full")


def loads_nan_weights(args: list[str]) -> bool:
    """Whether the command reads the NaN checkpoint's weights (eval --hyp scores a file and reads only the config;
    train --init starts from them)."""
    named = _named(args)
    return (args[0] == "train" and named.get("--init") == NAN) or (
        named.get("--checkpoint") == NAN
        and args[0] in ("translate", "eval", "attention", "export", "score")
        and ("--hyp" not in named)
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=command(), inside=st.sets(st.sampled_from(INSIDE)))
# a folder of the user's at --output, with --overwrite: found once by chance, now tried on every run
@example(args=["export", "--checkpoint", "runs/tiny/best", "--output", "folder", "--overwrite"], inside=set())
@example(args=["average", "runs/tiny", "--last", "1", "--output", "folder", "--overwrite"], inside=set())
# training into a full disk, found by chance: the tokenizer's write failed naming no file, a traceback
@example(args=["train", "--config", "quickstart", "--quiet", *QUICK, "--set", "run_dir=full"], inside=set())
# the cases of issue 49, each tried on every run
@example(
    args=["train", "--config", "quickstart", "--quiet", *QUICK, "--set", "name=tiny", "--overwrite"], inside=set(INSIDE)
)
@example(args=["average", "runs/tiny", "--last", "2", "--output", "runs/tiny/best", "--overwrite"], inside=set())
@example(
    args=[
        "translate",
        "--checkpoint",
        "runs/tiny/best",
        "--input",
        "in.de",
        "--output",
        "runs/tiny/best/model.safetensors",
        "--overwrite",
    ],
    inside=set(),
)
@example(args=["plot", "runs/tiny", "--output", "runs/tiny/log.jsonl", "--overwrite"], inside=set())
@example(args=["export", "--checkpoint", "runs/tiny/best", "--output", "loop"], inside=set())
@example(args=["export", "--checkpoint", "runs/tiny/best", "--output", "full/out_dir"], inside=set())
@example(args=["translate", "--input", "in.de", "--output", "hard.de", "--overwrite"], inside=set())
# a run's log as the output of a command that reads only its checkpoint, found by chance: replaced by a picture
@example(args=["attention", "0", "--output", "runs/tiny/log.jsonl", "--overwrite"], inside=set())
# the checkpoint it evaluates as eval's --output-dir, found by chance: the reports went into it
@example(args=["eval", "--output-dir", "runs/tiny/best"], inside=set())
# in.de itself with --overwrite, found by chance: its links show the new text too, as the user asked
@example(args=["translate", "--output", "in.de", "--overwrite"], inside=set())
def test_any_command_line_ends_in_a_documented_exit_code_and_writes_only_its_outputs(
    tiny_run, monkeypatch, args, inside
):
    root, full = workspace(tiny_run.run_dir, inside)
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
        read = reads(args)
        touched = {p for p in changed if any(p == r or p.startswith(r + "/") for r in read)}
        assert not {p for p in touched if "/eval/" not in p}, (args, touched)  # a checkpoint's eval reports may
        assert after.get("exists.en") == before["exists.en"] or "--overwrite" in args, args
        assert all(after.get(u) == before[u] for u in USERS[1:] + sorted(inside)), args  # never, --overwrite or not
        assert not any(p.startswith(HELD + "/") for p in changed), args  # nor a run another process holds
        assert result.exit_code == 2 or not loads_nan_weights(args), (args, result.output)
        assert all(stat.S_ISCHR(os.stat(d).st_mode) for d in DEVICES_NAMED if os.path.exists(d)), args
        assert not [p for p in root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name], args  # nothing left aside
        event(f"full disk mounted: {full}")
    finally:
        if full:
            unmount(root / "full")
        shutil.rmtree(root, ignore_errors=True)
