"""bench.recipe_search: variants train side by side, are compared on val, and only the one chosen there sees test."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import SAMPLE

from bench.recipe_search import _direction_choice, main
from transformer.checkpoint import read_config

QUICK = [
    "--set",
    "train.max_steps=3",
    "--set",
    "train.eval_every=1",
    "--set",
    "train.save_every=1",
    "--set",
    "train.keep_last=3",
    "--set",
    "train.eval_sentences=8",
]


def test_variants_are_compared_on_val_and_only_the_chosen_one_is_tested(tmp_path):
    runs = tmp_path / "runs"
    result = main(
        [
            *("--config", "quickstart", "--data", str(SAMPLE), "--device", "cpu", "--minutes", "2"),
            *("--runs", str(runs), "--variant", "plain", "--variant", "dropout0 model.dropout=0.0"),
            *("--variant", "typo train.lerning_rate=1", "--test", "--reach", "0", "--json", str(tmp_path / "r.json")),
            *("--alpha", "0.5", "--alpha", "2", "--average", "2", "--average", "3", "--ensemble", "plain,dropout0"),
            *QUICK,
        ]
    )
    plain, dropout0, typo = (result["runs"][n] for n in ("plain", "dropout0", "typo"))
    assert typo["exit_code"] == 2 and "val" not in typo
    assert plain["updates"] == dropout0["updates"] == 3 and dropout0["set"] == ["model.dropout=0.0"]
    scores = {
        (n, ck, float(alpha)): s["bleu"]
        for n in ("plain", "dropout0")
        for ck, by_alpha in result["runs"][n]["val"].items()
        for alpha, s in by_alpha.items()
    }
    assert {(ck, a) for _, ck, a in scores} == {(ck, a) for ck in ("best", "avg2", "avg3") for a in (0.5, 2.0)}
    for n in ("plain", "dropout0"):  # each run's own choice: its highest val BLEU over checkpoints and penalties
        own = result["runs"][n]["chosen_on_val"]
        assert (
            own["bleu"]
            == scores[(n, own["checkpoint"], own["alpha"])]
            == max(b for (m, _, _), b in scores.items() if m == n)
        )
    best = result["best_run_on_val"]
    assert scores[(best["run"], best["checkpoint"], best["alpha"])] == max(scores.values())
    written = read_config(Path(best["path"]))  # the best run's choice, with its length penalty for tfm translate
    assert written.decode.alpha == best["alpha"] and written.model.dropout == (
        0.0 if best["run"] == "dropout0" else 0.1
    )
    together = result["ensemble"]  # the two runs' choices decoding together, scored on val at the same penalties
    assert together["members"] == [
        str(runs / n / "best")
        if result["runs"][n]["chosen_on_val"]["checkpoint"] == "best"
        else str(runs / f"{n}.{result['runs'][n]['chosen_on_val']['checkpoint']}")
        for n in ("plain", "dropout0")
    ]
    assert sorted(together["val"]) == ["0.5", "2.0"]
    chosen = result["chosen_on_val"]  # the ensemble only if it beats the best run on val
    ensemble_wins = together["chosen_on_val"]["bleu"] > best["bleu"]
    assert chosen["run"] == ("ensemble" if ensemble_wins else best["run"])
    assert chosen["bleu"] == max(together["chosen_on_val"]["bleu"], best["bleu"])
    assert chosen["test"]["alpha"] == chosen["alpha"] and 0 <= chosen["test"]["bleu"] <= 100
    assert "case:lc" in chosen["test"]["bleu_lc_signature"]
    curve = plain["greedy_val_bleu_by_second"]  # a validation at each of the 3 updates, then the final one
    assert len(curve) >= 3 and [s for s, _ in curve] == sorted(s for s, _ in curve)
    assert plain["seconds_to_reach"] == curve[0][0]  # every BLEU reaches 0
    assert 0 < plain["validation_share"] < 1
    assert sorted(p.name for p in (runs / "eval").glob("*.test")) == [f"{chosen['run']}.chosen.test"]
    assert (tmp_path / "r.json").is_file()


def test_variants_need_names_of_their_own(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--config", "quickstart", "--variant", "a", "--variant", "a model.dropout=0.2", "--runs", str(tmp_path)])
    assert e.value.code == 2


def test_the_ensemble_is_the_choice_only_when_it_beats_the_best_run_on_val():
    best = {"run": "recipe", "checkpoint": "avg3", "alpha": 3.0, "bleu": 41.0, "path": "runs/recipe.chosen"}
    ensemble = {
        "members": ["runs/recipe/best", "runs/recipe-seed2.avg3"],
        "chosen_on_val": {"alpha": 2.0, "bleu": 41.5},
    }
    chosen = _direction_choice(best, ensemble)
    assert (chosen["run"], chosen["alpha"], chosen["bleu"], chosen["members"]) == (
        "ensemble",
        2.0,
        41.5,
        ensemble["members"],
    )
    assert (
        chosen["translate"]
        == "tfm translate --checkpoint runs/recipe/best --checkpoint runs/recipe-seed2.avg3 --alpha 2"
    )
    for bleu in (41.0, 40.0):  # a tie or less: the single run, which decodes at a fraction of the cost
        assert _direction_choice(best, {**ensemble, "chosen_on_val": {"alpha": 2.0, "bleu": bleu}}) == best
    assert _direction_choice(best, None) == best
