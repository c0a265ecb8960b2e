"""What the command line refuses before any work, and how: one line, exit 2, and the user's files untouched."""

import errno
import os
import shutil
import subprocess
import sys

import pytest
from tiny import ROOT, SAMPLE
from typer.testing import CliRunner

from cli import eval_cmd
from cli.guards import check_data_dir
from cli.main import app
from transformer.config_file import load
from transformer.errors import ConfigError
from transformer.storage.files import cannot_write


def tfm(*args: str):
    return CliRunner().invoke(app, [*map(str, args)])


def refused(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


@pytest.fixture
def files(tmp_path):
    src = tmp_path / "in.de"
    shutil.copy(SAMPLE / "valid.de", src)
    mine = tmp_path / "mine.en"
    mine.write_text("the user's own file\n", encoding="utf-8")
    return src, mine


@pytest.mark.parametrize("spelling", ["{d}/in.de", "{d}/./in.de", "{d}/sub/../in.de"])
def test_the_output_may_not_be_the_input_however_spelled(tiny_checkpoint, files, spelling):
    src, _ = files
    (src.parent / "sub").mkdir(exist_ok=True)
    before = src.read_bytes()
    result = tfm(
        "translate", "--checkpoint", tiny_checkpoint, "--input", src, "--output", spelling.format(d=src.parent)
    )
    refused(result, "is the same file as")
    assert src.read_bytes() == before


def test_an_existing_output_needs_overwrite(tiny_checkpoint, files):
    src, mine = files
    refused(tfm("translate", "--checkpoint", tiny_checkpoint, "--input", src, "--output", mine), "pass --overwrite")
    assert mine.read_text(encoding="utf-8") == "the user's own file\n"
    result = tfm("translate", "--checkpoint", tiny_checkpoint, "--input", src, "--output", mine, "--overwrite")
    assert result.exit_code == 0, result.output
    assert len(mine.read_text(encoding="utf-8").splitlines()) == len(src.read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("where, message", [("missing/out.en", "does not exist"), ("", "is a directory")])
def test_an_output_in_no_folder_or_that_is_a_folder_is_refused(tiny_checkpoint, files, where, message):
    src, _ = files
    refused(tfm("translate", "--checkpoint", tiny_checkpoint, "--input", src, "--output", src.parent / where), message)


def test_writing_to_a_full_device_and_to_a_closed_stdout_are_one_line(tiny_checkpoint):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "cli", "translate", "Ein Hund.", "--checkpoint", str(tiny_checkpoint)]
    if os.path.exists("/dev/full"):
        full = subprocess.run([*args, "--output", "/dev/full"], env=env, capture_output=True, text=True)
        assert full.returncode == 2 and full.stderr.startswith("error: cannot write /dev/full: no space left")
    closed = subprocess.run(
        args, env=env, stdout=None, stderr=subprocess.PIPE, text=True, close_fds=True, preexec_fn=lambda: os.close(1)
    )
    assert closed.returncode == 2 and "standard output is closed" in closed.stderr


def test_too_wide_a_beam_is_refused_before_any_work(tiny_checkpoint):
    refused(
        tfm("translate", "Ein Hund.", "--checkpoint", tiny_checkpoint, "--beam", "500"),  # its vocabulary: 400
        "larger than the model's vocabulary",
    )


def test_eval_prints_the_scores_before_a_report_that_cannot_be_written(tiny_checkpoint, tmp_path, monkeypatch):
    def full(folder, texts, kind):
        raise cannot_write(folder, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(eval_cmd, "write_files", full)
    result = tfm(
        "eval",
        "--checkpoint",
        tiny_checkpoint,
        "--src",
        SAMPLE / "valid.de",
        "--ref",
        SAMPLE / "valid.en",
        "--beam",
        "1",
        "--output-dir",
        tmp_path / "report",
        "--overwrite",
    )
    assert result.exit_code == 2
    assert result.stdout.startswith("BLEU = ") and "the scores above are complete" in result.stderr


def test_eval_refuses_src_beside_hyp(files):
    src, mine = files
    refused(tfm("eval", "--hyp", mine, "--ref", mine, "--src", src), "give one of them")


def test_average_will_not_write_onto_a_resumable_checkpoint(tiny_run):
    step = tiny_run.run_dir / "checkpoints" / "step_6"
    refused(tfm("average", tiny_run.run_dir, "--last", "2", "--output", step, "--overwrite"), "resumable checkpoints")


def test_train_refuses_resume_with_overwrite_and_a_run_dir_under_a_file(tmp_path, files):
    _, mine = files
    quick = ["train", "--config", "quickstart", "--set", f"data.path={SAMPLE}"]
    refused(tfm(*quick, "--resume", "--overwrite"), "give one of them")
    refused(tfm(*quick, "--set", f"run_dir={mine}/runs"), "is a file, not a folder")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/full"])
def test_an_endless_device_is_no_input(tiny_checkpoint, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    refused(tfm("translate", "--checkpoint", tiny_checkpoint, "--input", device), "a device that never ends")
    refused(tfm("eval", "--hyp", device, "--ref", device), "a device that never ends")


@pytest.mark.parametrize(
    "flag, key, bad, good",
    [
        ("--beam", "decode.beam", "0", "1"),
        ("--nbest", "decode.nbest", "0", "1"),
        ("--batch-tokens", "decode.batch_tokens", "0", "1"),
        ("--alpha", "decode.alpha", "-0.5", "0"),
        ("--alpha", "decode.alpha", "nan", "0.6"),
    ],
)
def test_a_decode_flag_meets_the_range_its_config_key_declares(tmp_path, flag, key, bad, good):
    """One table of ranges: the value a config file may not hold, the flag may not take, and the other way round."""
    section, name = key.split(".")
    config = tmp_path / "c.yaml"
    config.write_text(f"{section}:\n  {name}: {bad}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"{key}: .* is out of range"):
        load(config)
    refused(tfm("translate", "x", flag, bad, "--runs", tmp_path / "none"), f"{flag} {bad} is out of range")
    config.write_text(f"{section}:\n  {name}: {good}\n", encoding="utf-8")
    load(config)
    assert "out of range" not in tfm("translate", "x", flag, good, "--runs", tmp_path / "none").stderr


@pytest.fixture
def copied(tiny_run, tmp_path):
    """A copy of the tiny finished run, to point outputs at."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    return run


@pytest.mark.parametrize("command", ["translate", "attention"])
@pytest.mark.parametrize("spelling", ["file", "hardlink", "symlink"])
def test_overwrite_never_reaches_the_checkpoint_being_read(copied, tmp_path, command, spelling):
    weights = copied / "best" / "model.safetensors"
    output = {"file": weights, "hardlink": tmp_path / "hard.png", "symlink": tmp_path / "link.png"}[spelling]
    if spelling == "hardlink":
        os.link(weights, output)
    if spelling == "symlink":
        output.symlink_to(weights)
    before = weights.read_bytes()
    text = ["Ein Hund läuft."] if command == "attention" else ["Ein Hund läuft.", "--device", "cpu"]
    result = tfm(command, *text, "--checkpoint", copied / "best", "--output", output, "--overwrite")
    refused(result, f"is the same file as '{weights}', which this command reads")
    assert weights.read_bytes() == before


def test_plot_never_replaces_the_log_it_draws(copied):
    log = copied / "log.jsonl"
    before = log.read_bytes()
    refused(tfm("plot", copied, "--output", log, "--overwrite"), f"is the same file as '{log}'")
    assert log.read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["attention", "Ein Hund läuft.", "--checkpoint", "best", "--output", "log.jsonl"],
        ["translate", "Ein Hund läuft.", "--checkpoint", "checkpoints/step_6", "--output", "best/model.safetensors"],
        ["translate", "Ein Hund läuft.", "--checkpoint", "best", "--output", "checkpoints/step_6/meta.json"],
        ["translate", "Ein Hund läuft.", "--checkpoint", "best", "--output", ".tfm-files"],  # the record itself
    ],
)
def test_overwrite_never_replaces_a_file_of_a_folder_tfm_wrote(copied, args):
    """Found by the command-line property test: `tfm attention ... --output runs/r/log.jsonl --overwrite` replaced
    the run's log with a picture, though the command reads only the checkpoint."""
    command, sentence, *options = args
    args = [command, sentence, *(a if a.startswith("--") else copied / a for a in options)]
    output = args[-1]
    before = output.read_bytes()
    refused(tfm(*args, "--overwrite"), "folder tfm wrote, which needs it as it is")
    assert output.read_bytes() == before


def test_plot_replaces_its_own_picture_only(copied):
    pytest.importorskip("matplotlib")
    assert tfm("plot", copied).exit_code == 0 and tfm("plot", copied).exit_code == 0  # its own: drawn again
    (copied / "training.png").write_bytes(b"my own picture")
    refused(tfm("plot", copied), "was not drawn by tfm")
    assert (copied / "training.png").read_bytes() == b"my own picture"
    (copied / "training.png").unlink()
    assert tfm("plot", copied).exit_code == 0  # named, its own picture is drawn again as without --output
    assert tfm("plot", copied, "--output", copied / "training.png", "--overwrite").exit_code == 0


def test_the_standard_input_is_never_an_output(tiny_checkpoint, tmp_path):
    """`cat in.de | tfm translate --output /dev/stdin --overwrite` would write into the pipe it reads; `tfm translate
    --input in.de >> in.de` would grow the file as it reads it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "cli", "translate", "--checkpoint", str(tiny_checkpoint), "--device", "cpu"]
    piped = subprocess.run(
        [*args, "--output", "/dev/stdin", "--overwrite"],
        input="Ein Hund.\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 2 and "'/dev/stdin' is the same file as '/dev/stdin'" in piped.stderr, piped.stderr
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n", encoding="utf-8")
    with open(source, "a") as out:
        appended = subprocess.run(
            [*args, "--input", str(source)], stdout=out, stderr=subprocess.PIPE, env=env, text=True, timeout=120
        )
    assert appended.returncode == 2 and f"standard output is the file '{source}'" in appended.stderr
    assert source.read_text(encoding="utf-8") == "Ein Hund.\n"


def test_eval_never_writes_a_report_onto_what_it_reads_nor_replaces_a_users_file(tiny_checkpoint, tmp_path):
    report = tmp_path / "valid.de.beam1.hyp"
    args = ["eval", "--checkpoint", tiny_checkpoint, "--beam", "1", "--device", "cpu", "--output-dir", tmp_path]
    os.link(SAMPLE / "valid.en", tmp_path / "ref.en")
    os.symlink(tmp_path / "ref.en", report)
    refused(
        tfm(*args, "--src", SAMPLE / "valid.de", "--ref", tmp_path / "ref.en", "--overwrite"),
        "which this command reads",
    )
    report.unlink()
    report.write_text("my own hypotheses\n", encoding="utf-8")
    refused(
        tfm(*args, "--src", SAMPLE / "valid.de", "--ref", SAMPLE / "valid.en", "--overwrite"), "was not written by tfm"
    )
    assert report.read_text(encoding="utf-8") == "my own hypotheses\n"
    report.unlink()
    assert tfm(*args, "--src", SAMPLE / "valid.de", "--ref", SAMPLE / "valid.en").exit_code == 0
    assert tfm(*args, "--src", SAMPLE / "valid.de", "--ref", SAMPLE / "valid.en", "--overwrite").exit_code == 0


def test_data_dir_naming_another_folder_than_tfm_multi30k_is_refused(tmp_path, monkeypatch):
    """TFM_MULTI30K outranks --data-dir for Multi30k: a --data-dir naming another folder would be read silently
    from the variable's, so it is refused before anything is written."""
    elsewhere = tmp_path / "m30k"
    elsewhere.mkdir()
    runs = tmp_path / "runs"
    args = ["train", "--config", "multi30k-de-en", "--data-dir", str(elsewhere), "--set", f"run_dir={runs}"]
    refused(tfm(*args), "name different Multi30k folders, and TFM_MULTI30K is the one read")
    assert not runs.exists()
    check_data_dir(os.environ["TFM_MULTI30K"] + "/.", "multi30k")  # the same folder, spelt otherwise: no conflict
    check_data_dir(str(elsewhere), "text")  # TFM_MULTI30K is Multi30k's alone
    monkeypatch.delenv("TFM_MULTI30K")
    check_data_dir(str(elsewhere), "multi30k")
