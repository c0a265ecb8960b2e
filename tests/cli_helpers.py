"""Helpers for tests of the command line: `python -m cli` in a subprocess to send real signals to, whose stderr
can be read while it runs, and the one error line a refused command prints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from tiny import QUICKSTART, ROOT, TINY_SETS

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _default_sigint() -> None:
    """Give the child Ctrl-C's default action even where the tests themselves run with SIGINT ignored (nohup, &)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Proc:
    """A ``python -m cli`` subprocess, its stderr in a file; ``stdin=subprocess.PIPE`` keeps its input open."""

    def __init__(self, args: list[str], err: Path, stdin: int | None = subprocess.DEVNULL) -> None:
        self.err_path = err
        with open(err, "w") as f:
            self.p = subprocess.Popen(
                [sys.executable, "-m", "cli", *args],
                env=ENV,
                cwd=ROOT,
                stdin=stdin,
                stdout=subprocess.DEVNULL,
                stderr=f,
                preexec_fn=_default_sigint,
            )

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
        """Poll ``condition``; fail with the process's stderr if it exits or time runs out first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.p.poll() is not None:
                pytest.fail(f"exited ({self.p.returncode}) before {what}:\n{self.stderr}")
            if time.monotonic() > deadline:
                self.p.kill()
                pytest.fail(f"timed out waiting for {what}:\n{self.stderr}")
            time.sleep(0.02)

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            pytest.fail(f"did not exit within {timeout} s:\n{self.stderr}")


def train(tmp_path: Path, *extra: str, tag: str = "train") -> Proc:
    """`tfm train` of the tiny quickstart into ``tmp_path/runs/quickstart``, running until stopped."""
    args = ["train", "--config", str(QUICKSTART), "--quiet", *TINY_SETS, f"--set=run_dir={tmp_path / 'runs'}", *extra]
    return Proc(args, tmp_path / f"{tag}.err")


def run_of(tmp_path: Path) -> Path:
    """The run directory ``train`` writes."""
    return tmp_path / "runs" / "quickstart"


def train_steps(run: Path) -> list[int]:
    """Steps logged as training updates in log.jsonl (every update: log_every=1), skipping a half-written last line."""
    path = run / "log.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry["kind"] == "train":
            steps.append(entry["step"])
    return steps


def last_step(run: Path) -> int:
    return max(train_steps(run), default=0)


def one_error_line(stderr: str) -> str:
    """The single ``error:`` line of a refused command, which printed no traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    return errors[0]
