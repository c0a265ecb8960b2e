"""bench.hf_export on the tiny trained checkpoint: it exports, reloads, decodes both ways and explains each
difference (skipped without transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from tiny import ROOT, SAMPLE

from bench.hf_export import explain
from transformer import checkpoint

pytest.importorskip("transformers")


def test_quick_run_writes_agreement_and_bleu(tiny_run, tmp_path):
    out = tmp_path / "check.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.hf_export", "--checkpoint", str(tiny_run.run_dir / "best")]
        + ["--data-dir", str(SAMPLE), "--split", "valid", "--beam", "3", "--quick", "--json", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["source_ids_equal"] == "20/20"
    for name in ("greedy", "beam3_alpha0"):
        r = result[name]
        assert r["lines"] == 20 and r["same"] + sum(r["differences"].values()) == 20
        assert "unexplained" not in r["differences"], r


def test_a_difference_is_a_near_tie_only_when_the_two_tokens_score_alike(tiny_run):
    loaded = checkpoint.load(tiny_run.run_dir / "best")
    tok, model = loaded.tokenizer, loaded.model.eval()
    src = torch.tensor(tok.encode("Ein Hund läuft.") + [tok.end_id])
    with torch.no_grad():
        lprobs = model(src[None], torch.tensor([[tok.start_id]]))[0, -1].log_softmax(-1)
        best, worst = int(lprobs.argmax()), int(lprobs.argmin())
        assert explain(model, tok, src, [best], [worst], 50, tie=1e-4) == "unexplained"
        assert explain(model, tok, src, [best], [worst], 50, tie=1e9) == "near-tie"
        assert explain(model, tok, src, [best] * 3, [worst], 3, tie=1e-4) == "length limit"
