"""The real `tfm` command line, end to end, in subprocesses: train -> translate -> eval, and its errors."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import one_error_line
from corpus_files import TRADITIONAL_EMOJI, has_cjk
from tiny import QUICKSTART, ROOT, SAMPLE, TINY_SETS, assert_resumable, run_trainer, step_of
from typer.testing import CliRunner

from cli.main import app
from transformer import checkpoint, config_file
from transformer.config import DataConfig
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.text.corpus import load_split
from transformer.training import update

QUICK = ["--set", "train.max_steps=30", "--set", "train.eval_every=30", "--set", "train.save_every=30"]


def tfm(*args, cwd=None, input=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "cli", *map(str, args)],
        cwd=cwd,
        input=input,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs = tmp_path_factory.mktemp("e2e") / "runs"
    r = tfm(
        "train",
        "--config",
        ROOT / "configs" / "quickstart.yaml",
        "--quiet",
        "--set",
        f"run_dir={runs}",
        "--set",
        f"data.path={SAMPLE}",
        *QUICK,
    )
    assert r.returncode == 0, r.stderr
    return runs


def test_train_writes_a_run(trained):
    run = trained / "quickstart"
    assert (run / "best" / "model.safetensors").is_file()
    assert (run / "log.jsonl").read_text().count('"kind": "valid"') >= 1


def test_translate_sentence_file_and_stdin(trained, tmp_path):
    r = tfm("translate", "Ein Mann fährt Fahrrad.", "--runs", trained)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 1
    src = tmp_path / "in.de"
    src.write_bytes("\ufeffEin Hund läuft.\r\n\n   \nDie Frau liest.\x07\n".encode())
    out = tmp_path / "out.en"
    r = tfm("translate", "--input", src, "--output", out, "--runs", trained, "--beam", "3")
    assert r.returncode == 0, r.stderr
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[2] == "" and lines[4] == ""
    assert lines[0] and lines[3]
    r = tfm("translate", "--greedy", "--runs", trained, input="Ein Hund läuft.\n\nDie Frau liest.\n")
    assert r.returncode == 0 and r.stdout.split("\n")[1] == "" and len(r.stdout.splitlines()) == 3


def test_a_pipe_given_as_a_path_is_read_like_a_file(trained):
    """--input /dev/stdin (or bash's <(...)) names a pipe, whose resolved name cannot be opened again."""
    r = tfm("translate", "--input", "/dev/stdin", "--greedy", "--runs", trained, input="Ein Hund läuft.\nDie Frau.\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    "args, said",
    [
        (["translate", "x", "--beam", "0"], "--beam 0 is out of range; it must be 1 to 1,000"),
        (["translate", "x", "--batch-size", "0"], "--batch-tokens 0 is out of range; it must be 1 to 1,000,000,000"),
        (["average", "runs/x", "--last", "0"], "--last 0 is out of range; it must be 1 to 1,000,000"),
        (["eval", "--beam", "-2"], "--beam -2 is out of range; it must be 1 to 1,000"),
        (["translate", "x", "--alpha", "1000"], "--alpha 1000 is out of range; it must be 0 to 10"),
        (["translate", "x", "--nbest", "10" * 20], f"--nbest {'10' * 20} is out of range; it must be 1 to 1,000"),
        (["train", "-c", "quickstart", "--nproc", "100000"], "--nproc 100000 is out of range; it must be 1 to"),
    ],
)
def test_numbers_out_of_their_finite_range_are_one_line(args, said):
    r = tfm(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(f"error: {said}")


@pytest.mark.parametrize(
    "sets, said",
    [
        (
            ["model.d_model=1073741824", "model.h=2"],
            "model.d_model: 1073741824 is out of range; it must be 1 to 65,536",
        ),
        (["model.N=1000", "model.d_model=65536", "model.d_ff=1048576"], "GiB to train, and cpu has"),
    ],
)
def test_a_model_too_big_to_train_is_refused_before_anything_is_written(tmp_path, sets, said):
    r = tfm("train", "-c", "quickstart", "--set", "device=cpu", *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, said",
    [
        (["translate", "--beam", "abc", "x"], "invalid value for '--beam'"),
        (["translate", "x", "--alpha", "much"], "invalid value for '--alpha'"),
        (["eval", "--bogus"], "no such option: --bogus"),
        (["trian"], "no such command 'trian'"),
        (["average"], "missing argument 'run'"),
    ],
)
def test_a_flag_of_the_wrong_type_or_an_unknown_one_is_tfms_one_line(args, said):
    """Typer's usage box is many lines; tfm's refusal is one, naming the flag and where the help is."""
    r = tfm(*args)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {said}") and line.endswith("--help"), line


def test_nbest(trained):
    r = tfm("translate", "Ein Hund läuft.", "--runs", trained, "--beam", "3", "--nbest", "3")
    rows = r.stdout.splitlines()
    assert r.returncode == 0 and len(rows) == 3 and all(row.startswith("1 ||| ") for row in rows)
    scores = [float(row.rsplit("|||", 1)[1]) for row in rows]
    assert scores == sorted(scores, reverse=True)
    r = tfm("translate", "Ein Hund läuft.", "--runs", trained, "--beam", "2", "--nbest", "3")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: nbest 3 is larger than the beam 2; ask for at most 2 (--nbest, or decode.nbest in a config)"
    ]


def test_eval_prints_signature_and_writes_scores(trained, tmp_path):
    r = tfm("eval", "--runs", trained, "--beam", "2")
    assert r.returncode == 0, r.stderr
    assert (
        "BLEU = " in r.stdout and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in r.stdout and "chrF = " in r.stdout
    )
    saved = json.loads(next((trained / "quickstart" / "best" / "eval").glob("*.json")).read_text())
    assert saved["beam"] == 2 and 0 <= saved["bleu"] <= 100
    again = tfm("eval", "--runs", trained, "--beam", "2")  # the same report again: refused before any work
    assert again.returncode == 2 and "a report is already in" in again.stderr and "--overwrite" in again.stderr
    assert tfm("eval", "--runs", trained, "--beam", "2", "--overwrite").returncode == 0
    hyp, ref = tmp_path / "h", tmp_path / "r"
    hyp.write_text("a\nb\n")
    ref.write_text("a\nb\nc\n")
    r = tfm("eval", "--hyp", hyp, "--ref", ref)
    assert r.returncode == 2 and "2 hypotheses but 3 references" in r.stderr and "Traceback" not in r.stderr


def test_output_into_head_has_no_broken_pipe(trained, tmp_path):
    src = tmp_path / "many.de"
    src.write_text("Ein Hund läuft.\n" * 300)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m cli translate --greedy --input {src} --runs {trained} | head -1"
    r = subprocess.run(cmd, shell=True, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--config", "nope.yaml"], "config file 'nope.yaml' not found"),
        (
            ["train", "--config", ROOT / "configs" / "quickstart.yaml", "--set", "model.dropuot=0.2"],
            "did you mean 'model.dropout'",
        ),
        (
            [
                "train",
                "--config",
                ROOT / "configs" / "quickstart.yaml",
                "--set",
                "precision=fp16",
                "--set",
                "device=cpu",
                "--set",
                f"data.path={ROOT / 'data' / 'sample'}",  # found: the data is looked for before the precision
            ],
            "precision: fp16 needs a CUDA GPU",
        ),
        (["translate", "x", "--precision", "fp8"], "precision 'fp8' is not one of fp32, bf16, fp16, int8"),
        (["translate", "x", "--checkpoint", "/nonexistent"], "checkpoint '/nonexistent' not found"),
        (["translate", "x", "--runs", "/nonexistent"], "no checkpoint found"),
    ],
)
def test_errors_are_one_line_exit_2(args, message, tmp_path):
    r = tfm(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1


def test_help_does_not_import_torch():
    code = (
        "import sys; sys.argv = ['tfm', '--help']\nfrom cli.main import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "train" in r.stdout and r.stdout.strip().endswith("NO-TORCH")


def test_configs_lists_the_shipped_configs_and_train_takes_one_by_name(tmp_path):
    r = tfm("configs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert {"base", "big", "quickstart", "small", "wmt14-base", "wmt14-big"} <= set(names)
    r = tfm(
        "train",
        "--config",
        "quickstart",
        "--quiet",
        "--set",
        f"run_dir={tmp_path}",
        "--set",
        f"data.path={SAMPLE}",
        "--set",
        "train.max_steps=1",
        "--set",
        "train.eval_every=1",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "quickstart" / "best").is_dir()


# ---- English <-> Chinese: a language without spaces, trained, translated and scored from the shell ----

PARK = ("We will go to the park tomorrow.", "我们明天去公园。")


@pytest.fixture(scope="module")
def chinese_pairs(tatoeba: Path) -> list[tuple[str, str]]:
    """31 seeded Tatoeba cmn-eng pairs of up to 12 Chinese characters, plus the README's example."""
    cfg = DataConfig(format="tsv", path=str(tatoeba), tsv_columns=["en", "zh"], src_lang="en", tgt_lang="zh")
    corpus = load_split(cfg, "train")
    short = [i for i in range(len(corpus)) if len(corpus.tgt[i]) <= 12]
    rows = np.random.default_rng(0).choice(short, size=31, replace=False).tolist()
    return [(corpus.src[i], corpus.tgt[i]) for i in rows] + [PARK]


def train_tiny(folder: Path, pairs: list[tuple[str, str]], src: str, tgt: str) -> Path:
    """Overfit a 1-layer model on ``pairs`` (English first in the TSV) and return its best checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid"):
        (folder / f"{split}.tsv").write_text("".join(f"{e}\t{z}\n" for e, z in pairs), encoding="utf-8")
    steps = 80
    cfg = config_file.from_dict(
        {
            "name": f"{src}-{tgt}",
            "run_dir": str(folder / "runs"),
            "device": "cpu",
            "model": {"N": 1, "d_model": 64, "d_ff": 128, "h": 2, "dropout": 0.0, "max_positions": 128},
            "data": {
                "format": "tsv",
                "path": str(folder),
                "tsv_columns": ["en", "zh"],
                "src_lang": src,
                "tgt_lang": tgt,
                "valid_split": "valid",
                "test_split": "valid",
            },
            "tokenizer": {"vocab_size": 1000},
            "train": {
                "batch_tokens": 4000,
                "label_smoothing": 0.0,
                "peak_lr": 0.01,
                "warmup": 10,
                "max_steps": steps,
                "eval_every": steps,
                "save_every": steps,
                "eval_sentences": len(pairs),
                "keep_last": 1,
            },
            "decode": {"beam": 1},
        }
    )
    run_trainer(cfg)
    return cfg.out_dir / "best"


@pytest.fixture(scope="module")
def en_zh_model(tmp_path_factory: pytest.TempPathFactory, chinese_pairs: list[tuple[str, str]]) -> Path:
    return train_tiny(tmp_path_factory.mktemp("en-zh"), chinese_pairs, "en", "zh")


@pytest.fixture(scope="module")
def zh_en_model(tmp_path_factory: pytest.TempPathFactory, chinese_pairs: list[tuple[str, str]]) -> Path:
    return train_tiny(tmp_path_factory.mktemp("zh-en"), chinese_pairs, "zh", "en")


def test_tiny_en_zh_model_reproduces_32_pairs_exactly(en_zh_model: Path, chinese_pairs: list[tuple[str, str]]) -> None:
    translator = Translator.from_checkpoint(en_zh_model, TranslateOptions("cpu", beam=1))
    out = [t.best for t in translator.translate([e for e, _ in chinese_pairs])]
    assert [(e, z, o) for (e, z), o in zip(chinese_pairs, out) if z != o] == []


def shell(command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in bash, where ``tfm`` is this checkout's CLI (on one thread: the models are tiny)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    script = f'tfm() {{ {shlex.quote(sys.executable)} -m cli "$@"; }}\n{command}'
    return subprocess.run(
        ["bash", "-c", script], input=stdin, env=env, capture_output=True, encoding="utf-8", timeout=300
    )


def test_translate_from_the_shell_and_stdin(en_zh_model: Path, zh_en_model: Path) -> None:
    zh_en, en_zh = shlex.quote(str(zh_en_model)), shlex.quote(str(en_zh_model))
    r = shell(f'tfm translate "{PARK[1]}" --checkpoint {zh_en} --greedy')
    assert r.returncode == 0 and r.stdout == PARK[0] + "\n", r.stderr
    r = shell(f'tfm translate "{PARK[0]}" --checkpoint {en_zh} --greedy')
    assert r.returncode == 0 and r.stdout == PARK[1] + "\n", r.stderr
    lines = [PARK[1], *TRADITIONAL_EMOJI]
    r = shell(f"tfm translate --checkpoint {zh_en}", stdin="".join(f"{x}\n" for x in lines))
    out = r.stdout.split("\n")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert len(out) == len(lines) + 1 and out[0] == PARK[0] and all(out[:-1])
    r = shell(f"printf '%s\\n' {shlex.quote(PARK[0] + ' 🌳')} | tfm translate --checkpoint {en_zh}")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1 and has_cjk(r.stdout), r.stderr


def test_eval_prints_the_bleu_signature_of_the_target_language(en_zh_model: Path, zh_en_model: Path) -> None:
    r = shell(f"tfm eval --checkpoint {shlex.quote(str(en_zh_model))} --beam 1")
    assert r.returncode == 0, r.stderr
    assert "BLEU = 100.00" in r.stdout and "tok:zh" in r.stdout and "chrF = 100.00" in r.stdout
    r = shell(f"tfm eval --checkpoint {shlex.quote(str(zh_en_model))} --beam 1")
    assert r.returncode == 0 and "tok:13a" in r.stdout, r.stderr


# ---- refusals and interruptions, through the Typer app in this process: exit code and one line, no traceback ----


def test_ctrl_c_while_loading_exits_130_without_a_traceback(monkeypatch):
    """Before training installs its own handler (config, data, tokenizer): one line and 130, not click's exit 1."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(config_file, "load", interrupted)
    r = CliRunner().invoke(app, ["train", "--config", str(QUICKSTART)])
    assert r.exit_code == 130 and r.stderr.strip() == "interrupted"


def test_a_loss_gone_non_finite_ends_the_cli_run_with_exit_1_and_a_hint(tmp_path, monkeypatch):
    """What an absurd learning rate does (one within train.peak_lr's range cannot push fp32 weights past the largest
    float on this model, so the loss is made non-finite from the fourth update on)."""
    real, calls = update.generator_loss, []

    def diverging(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan"), nll) if len(calls) > 3 else (loss, nll)

    monkeypatch.setattr(update, "generator_loss", diverging)
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--config",
            str(QUICKSTART),
            "--quiet",
            *TINY_SETS,
            f"--set=run_dir={tmp_path}",
            "--set=train.warmup=1",
            "--set=train.max_bad_steps=3",
            "--set=train.save_every=1",
        ],
    )
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.stderr
    assert re.search(
        r"stopped: 3 updates in a row with non-finite loss or gradients at step \d+ "
        r"\(last finite loss \d+\.\d{4}, lr \S+, loss scale 1\.0\); lower train.peak_lr",
        r.stderr,
    )
    for path in checkpoint.step_dirs(tmp_path / "quickstart"):
        assert_resumable(path, step_of(path))


BAD_CONFIGS = {
    "unknown-key": (
        ["--set=train.lable_smoothing=0.2"],
        "unknown config key 'train.lable_smoothing'; did you mean 'train.label_smoothing'?",
    ),
    "wrong-type": (["--set=model.h=eight"], "model.h: expected int, got 'eight'"),
    "dropout-1.5": (["--set=model.dropout=1.5"], "model.dropout: 1.5 is out of range; it must be in [0, 1)"),
    "d_model-vs-h": (
        ["--set=model.d_model=30", "--set=model.h=4"],
        "model.d_model (30) must be divisible by model.h (4)",
    ),
    "missing-data": (["--set=data.path={tmp}/none"], "missing train.de[.gz], train.en[.gz] in {tmp}/none"),
    "fp16-on-cpu": (["--set=precision=fp16"], "precision: fp16 needs a CUDA GPU but the device is cpu"),
    "fp8": (["--set=precision=fp8"], "precision 'fp8' is not one of fp32, bf16, fp16, auto; pick one of them"),
    "cuda-without-cuda": (["--set=device=cuda"], "device: cuda but this machine has no CUDA GPU"),
}


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_bad_config_is_one_error_line_and_exit_2(name, tmp_path):
    if name == "cuda-without-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    sets, message = BAD_CONFIGS[name]
    args = ["train", "--config", str(QUICKSTART), "--quiet", *TINY_SETS, f"--set=run_dir={tmp_path}"]
    r = CliRunner().invoke(app, args + [s.format(tmp=tmp_path) for s in sets])
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit), r.exception
    assert message.format(tmp=tmp_path) in one_error_line(r.stderr)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel:\n  N: 1\n d_model: 2\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["train", "--config", str(bad)])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert f"{bad}: YAML syntax error at line 4, column 2" in one_error_line(r.stderr)


@pytest.mark.parametrize(
    "args, flag",
    [
        (["translate", "x", "--beam", "3", "--beam", "5"], "--beam"),
        (["train", "-c", "small", "--config=big"], "--config"),
    ],
)
def test_a_flag_of_one_value_given_twice_is_refused_not_silently_the_last(args, flag):
    r = tfm(*args)
    assert r.returncode == 2 and f"{flag} is given twice" in r.stderr and "Traceback" not in r.stderr
