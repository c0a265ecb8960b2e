"""bench.bleu_budget runs end to end at a smoke size: both contestants train side by side, translate and are scored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2", "tokenizer.vocab_size=600"]


def test_bleu_budget_runs_at_a_smoke_size(multi30k_dir: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.bleu_budget", "--minutes", "0.05", "--test-sentences", "4"]
    cmd += ["--data", str(multi30k_dir), "--runs", str(tmp_path), *[a for s in TINY for a in ("--set", s)]]
    proc = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tfm"]["steps"] > 0 and result["marian"]["steps"] > 0
    assert result["tfm"]["tokenizer"] == result["marian"]["tokenizer"]
