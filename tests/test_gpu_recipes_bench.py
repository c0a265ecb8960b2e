"""bench.gpu_recipes: every GPU variant is a valid config, and the search runs end to end on the CPU (--quick)."""

from pathlib import Path

import pytest

from bench.gpu_recipes import AVERAGES, DIRECTIONS, ENSEMBLE, GPU, QUICK_ALPHAS, VARIANTS, main
from transformer.config_file import load


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_variant_is_a_config_tfm_accepts(direction: str):
    for name, sets in VARIANTS.items():
        cfg = load(direction, [*GPU, *sets.split()])
        assert cfg.train.max_steps == 20000, name


def test_both_directions_search_train_score_on_val_and_test_the_chosen(
    small_multi30k: Path, tmp_path: Path, monkeypatch
):
    """--quick: every step of round two on the CPU, the length-penalty grid, the averages of 3 and 5 and the ensemble
    of the recipe's seeds included."""
    monkeypatch.delenv("TFM_MULTI30K")  # it outranks --data-dir, and the runs read the small copy
    out = tmp_path / "out"
    args = ["--data", str(small_multi30k), "--device", "cpu", "--quick", "--runs", str(tmp_path / "runs")]
    results = main([*args, "--out", str(out), "--minutes", "2"])
    assert sorted(p.name for p in out.glob("*.json")) == sorted(f"{d}.json" for d in DIRECTIONS)
    for direction, result in results.items():
        assert list(result["runs"]) == list(ENSEMBLE)
        for run in result["runs"].values():
            assert run["exit_code"] == 0 and run["updates"] == 5, direction
            assert {ck: sorted(by_alpha) for ck, by_alpha in run["val"].items()} == {
                ck: [str(a) for a in QUICK_ALPHAS] for ck in ("best", *(f"avg{k}" for k in AVERAGES))
            }
        assert len(result["ensemble"]["members"]) == 3 and sorted(result["ensemble"]["val"]) == sorted(
            str(a) for a in QUICK_ALPHAS
        )
        assert "bleu_lc" in result["chosen_on_val"]["test"]
        assert result["chosen_on_val"]["test"]["alpha"] == result["chosen_on_val"]["alpha"]
    assert (out / "curves.png").stat().st_size > 0
