"""What tfm reads back or looks for, damaged or misplaced, through the command line: one line that says what the
thing is and what to do, exit 2, and nothing made or changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_helpers import ENV, one_error_line
from tiny import QUICKSTART, SAMPLE, TINY_SETS


def tfm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=300
    )


def test_a_corpus_folder_that_does_not_exist_is_found_missing_before_anything_slow(tmp_path: Path) -> None:
    """TFM_MULTI30K pointing nowhere: refused before the precision is measured (precision: auto, no verdict kept),
    and no folder made anywhere."""
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    r = tfm(
        "train",
        "--config",
        "small",
        f"--set=run_dir={runs}",
        "--set=precision=auto",
        "--set=device=cpu",
        env={"TFM_MULTI30K": str(tmp_path / "x" / "nowhere" / "m30k"), "XDG_CACHE_HOME": str(cache)},
    )
    assert "(TFM_MULTI30K) does not exist" in one_error_line(r.stderr) and "precision auto" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _copy_sample(folder: Path) -> None:
    folder.mkdir()
    for name in ("train.de", "train.en", "valid.de", "valid.en"):
        (folder / name).write_bytes((SAMPLE / name).read_bytes())


def test_a_utf16_corpus_is_told_as_utf16_and_a_fifo_as_a_fifo(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _copy_sample(data)
    (data / "train.de").write_bytes((SAMPLE / "train.de").read_text(encoding="utf-8").encode("utf-16"))
    base = ["train", "--config", str(QUICKSTART), *TINY_SETS, f"--set=data.path={data}", f"--set=run_dir={tmp_path}/r"]
    line = one_error_line(tfm(*base).stderr)
    assert "it looks like UTF-16; convert the file to UTF-8, e.g. iconv -f utf-16 -t utf-8" in line
    (data / "train.de").unlink()
    os.mkfifo(data / "train.de")
    line = one_error_line(tfm(*base).stderr)
    assert "train.de is a named pipe (FIFO); tfm reads a corpus from files" in line
    assert not (tmp_path / "r").exists()


def test_a_run_its_checkpoints_folder_or_an_export_given_as_a_checkpoint_is_told_what_it_is(tiny_run, tmp_path):
    run = tiny_run.run_dir
    cases = [
        (run, f"is a run directory, not a checkpoint; give one of its checkpoints, e.g. {run / 'best'}"),
        (
            run / "checkpoints",
            f"is a run's folder of step checkpoints; give one of them, e.g. {run / 'checkpoints' / 'step_6'}",
        ),
    ]
    export = tmp_path / "ct2"
    r = tfm("export", "--checkpoint", str(run / "best"), "--output", str(export))
    if r.returncode == 0:  # CTranslate2 is in the dev extra
        cases.append((export, "is an exported model (for transformers or CTranslate2); give the checkpoint it was"))
    for path, told in cases:
        assert told in one_error_line(tfm("translate", "Hallo", "--checkpoint", str(path)).stderr)


def test_eval_output_dir_naming_a_file_says_it_is_a_file(tiny_run, tmp_path):
    (tmp_path / "report").write_text("mine\n")
    r = tfm("eval", "--checkpoint", str(tiny_run.run_dir / "best"), "--output-dir", str(tmp_path / "report"))
    assert "is a file, not a folder; name a folder" in one_error_line(r.stderr)
    assert (tmp_path / "report").read_text() == "mine\n"


def test_a_precision_verdict_that_could_not_be_kept_says_so(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would go")
    data = tmp_path / "data"
    _copy_sample(data)
    r = tfm(
        "train",
        "--config",
        str(QUICKSTART),
        *TINY_SETS,
        f"--set=data.path={data}",
        f"--set=run_dir={tmp_path}/r",
        "--set=precision=auto",
        "--set=train.max_steps=1",
        "--quiet",
        env={"XDG_CACHE_HOME": str(blocker)},
    )
    said = [line for line in r.stderr.splitlines() if line.startswith("precision auto")]
    if said:  # a CPU with AMX decides by rule, unmeasured
        assert "could not keep it in" in said[0] and "measured again next time" in said[0]
    assert json.loads((tmp_path / "r" / "quickstart" / "best" / "meta.json").read_text())["step"] == 1
