"""bench.run's ensemble section: the ensemble and each member decode the same batches; each row holds the members'
seconds per sentence summed over the ensemble's, and the table shows it against its target."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.run import run_ensemble
from bench.summary import TARGETS, table
from transformer import checkpoint
from transformer.model.transformer import Transformer

LINES = [f"Ein Hund läuft {i} mal." for i in range(40)]


def test_the_ensemble_section_measures_the_ensemble_against_its_members(tiny_checkpoint, tmp_path):
    first = checkpoint.load(tiny_checkpoint)
    torch.manual_seed(1)
    model = Transformer(first.cfg.model, first.tokenizer.vocab_size, first.tokenizer.pad_id)
    second = replace(first, model=model, path=tmp_path / "second")
    rows = run_ensemble(argparse.Namespace(quick=True), [first, second], LINES, LINES)
    assert [(r["beam"], r["batch"]) for r in rows] == [(1, 32), (1, 1), (5, 32), (5, 1)]
    for r in rows:
        alone = 1 / r["member 1"]["sentences_per_s"] + 1 / r["member 2"]["sentences_per_s"]
        assert r["members_vs_ensemble"] == alone * r["tfm"]["sentences_per_s"] > 0
    shown = table({"ensemble": rows}).splitlines()
    assert sum(line.startswith("ensemble of 2 ") for line in shown) == 4 and TARGETS["members_vs_ensemble"] == 1.0


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "sections, keys",
    [
        ("train", ["train"]),
        ("decode,int8,startup", ["decode", "int8", "startup_memory"]),
        ("memory,levers", ["startup_memory", "levers"]),  # not contended: levers' OpenMP rows, 3 minutes under load
        ("student", ["student"]),  # the tiny run's model as its own student: the section's plumbing, not its figures
    ],
)
def test_bench_run_sections_run_at_their_quick_size(tiny_run, multi30k_dir, tmp_path, sections, keys):
    """Each section of bench.run runs end to end at its quick size (a few test lines, the tiny run's model), so a
    change that breaks one does not land; the figures themselves are not checked."""
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "bench.run", "--quick", "--lines", "8", "--sections", sections]
    best = str(tiny_run.run_dir / "best")
    cmd += ["--checkpoint", best, "--student", best, "--data", str(multi30k_dir)]
    if "student" in keys:  # and the student with a lexical shortlist
        shortlist = tmp_path / "shortlist.safetensors"
        made = subprocess.run([sys.executable, "-m", "cli", "shortlist", "--checkpoint", best, "-o", str(shortlist)])
        assert made.returncode == 0
        cmd += ["--shortlist", str(shortlist)]
    proc = subprocess.run(
        [*cmd, "--runs", str(tmp_path / "runs"), "--json", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert all(result.get(key) for key in keys), {key: result.get(key) for key in keys}
    if "student" in keys:
        assert "student_shortlist_vs_recipe_int8" in result["student"]["grid"][0]["ratios"]
