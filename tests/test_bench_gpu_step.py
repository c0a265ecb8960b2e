"""bench.gpu_step runs end to end on the CPU (--device cpu --quick) and writes every section of its JSON."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_step_quick_on_cpu_writes_every_section(multi30k_dir: Path, tmp_path: Path) -> None:
    """Multi30k comes from TFM_MULTI30K (made absolute by conftest), the script's default --data."""
    out = tmp_path / "out.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.gpu_step",
        "--device",
        "cpu",
        "--quick",
        "--json",
        str(out),
        "--runs",
        str(tmp_path / "runs"),
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env={**os.environ, "TFM_MULTI30K": str(multi30k_dir)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for section in ("profile", "levers", "train", "compile"):
        assert isinstance(result.get(section), dict), (section, result.get(section))
        assert "error" not in result[section], (section, result[section]["error"])

    levers = result["levers"]
    for name in ("default", "static shapes"):
        assert levers[name]["tgt_tok_s"] > 0, (name, levers[name])
    assert "cuda graphs" not in levers  # CUDA only

    train = result["train"]
    assert set(train) == {"levers off", "levers on (as configs/base-gpu.yaml)"}
    for name, row in train.items():
        assert isinstance(row["valid_loss"], float) and math.isfinite(row["valid_loss"]), (name, row)
    assert "default" in result["compile"]
    assert result["profile"]["default"]["wall_s_per_update"] > 0
