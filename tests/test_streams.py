"""cli.streams: a reader that goes away from stdout or stderr never stops tfm train."""

import os
import subprocess
import sys

from cli_helpers import ENV
from tiny import QUICKSTART, ROOT, TINY_SETS

from cli.streams import Unbroken
from transformer import checkpoint


def test_a_closed_pipe_swallows_what_is_written_after_it():
    read, write = os.pipe()
    stream = Unbroken(os.fdopen(write, "w", buffering=1))
    stream.write("first\n")
    os.close(read)  # the reader leaves
    stream.write("second\n")
    stream.flush()
    assert stream.gone and stream.write("third\n") == len("third\n")


def test_training_goes_on_when_its_reader_goes_away(tmp_path):
    """`tfm train ... 2>&1 | head -2`: the reader leaves after two lines; the run still ends with its checkpoint."""
    args = ["train", "--config", str(QUICKSTART), *TINY_SETS, f"--set=run_dir={tmp_path}"]
    args += ["--set=train.max_steps=30", "--set=train.save_every=30"]
    p = subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    for _ in range(2):
        p.stdout.readline()
    p.stdout.close()
    assert p.wait(timeout=300) == 0
    assert [d.name for d in checkpoint.step_dirs(tmp_path / "quickstart")] == ["step_30"]
