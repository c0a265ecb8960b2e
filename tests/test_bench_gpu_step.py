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
    cmd = [sys.executable, "-m", "bench.gpu_step", "--device", "cpu", "--quick", "--json", str(out)]
    proc = subprocess.run(
        [*cmd, "--runs", str(tmp_path / "runs")],
        cwd=REPO,
        env={**os.environ, "TFM_MULTI30K": str(multi30k_dir)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for section in ("start", "levers", "compile", "decode", "profile", "whole"):
        assert isinstance(result.get(section), dict), (section, result.get(section))
        assert "error" not in result[section], (section, result[section]["error"])

    for run in ("cold", "warm"):  # tfm train twice, each in a process of its own
        row = result["start"][run]
        assert 0 < row["set_up_s"] < row["first_update_s"] < row["wall_s"], row
        assert math.isfinite(row["valid_loss"]) and Path(row["checkpoint"]).is_dir(), row

    levers = result["levers"]
    assert {"levers off", "static shapes", "marian"} <= set(levers) and "cuda graphs" not in levers  # CUDA only
    for name, row in levers.items():
        assert row["tgt_tok_s"] > 0 and row["vs_levers_off"] > 0 and row["vs_marian"] > 0, (name, row)
    assert set(result["compile"]) == set(result["whole"]) == {"levers off", "marian"}  # compilation: CUDA only

    decode = result["decode"]
    assert decode["precision"] == "fp32" and "GPU only" in decode["ctranslate2"]
    for point in ("greedy, batch 1", "greedy, batch 64", "beam 5, batch 1", "beam 5, batch 64"):
        tfm, generate = decode[point]["tfm"], decode[point]["generate"]
        assert tfm["identical_to_tfm"] == 1.0 and 0 <= generate["identical_to_tfm"] <= 1, (point, decode[point])
        assert tfm["sentences_per_s"] > 0 and generate["tfm_speedup"] > 0, (point, decode[point])
    for search, row in decode["host waits, batch 64"].items():  # the waits themselves are counted on CUDA only
        assert row["sentences"] == 64 and row["host_waits"] is None, (search, row)
        assert row["steps"] + 1 < row["reads"] <= 2 * row["steps"] + 1, (search, row)
    assert result["profile"]["levers off"]["wall_s_per_update"] > 0
