"""bench.run's ensemble section: the ensemble and each member decode the same batches; each row holds the members'
seconds per sentence summed over the ensemble's, and the table shows it against its target."""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from bench.run import TARGETS, run_ensemble, table
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
