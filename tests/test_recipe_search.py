"""bench.recipe_search: variants train side by side, are compared on val, and only the one chosen there sees test."""

from __future__ import annotations

import pytest
from tiny import SAMPLE

from bench.recipe_search import main

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
            "--config",
            "quickstart",
            "--data",
            str(SAMPLE),
            "--device",
            "cpu",
            "--minutes",
            "2",
            "--runs",
            str(runs),
            "--variant",
            "plain",
            "--variant",
            "dropout0 model.dropout=0.0",
            "--variant",
            "typo train.lerning_rate=1",
            "--test",
            "--reach",
            "0",
            "--json",
            str(tmp_path / "r.json"),
            *QUICK,
        ]
    )
    plain, dropout0, typo = (result["runs"][n] for n in ("plain", "dropout0", "typo"))
    assert typo["exit_code"] == 2 and "val" not in typo
    assert plain["updates"] == dropout0["updates"] == 3 and dropout0["set"] == ["model.dropout=0.0"]
    scores = {(n, ck): s["bleu"] for n in ("plain", "dropout0") for ck, s in result["runs"][n]["val"].items()}
    assert len(scores) == 4
    chosen = result["chosen_on_val"]
    assert scores[(chosen["run"], chosen["checkpoint"])] == max(scores.values())
    assert 0 <= chosen["test"]["bleu"] <= 100 and "case:lc" in chosen["test"]["bleu_lc_signature"]
    curve = plain["greedy_val_bleu_by_minute"]  # a validation at each of the 3 updates, then the final one
    assert len(curve) >= 3 and [m for m, _ in curve] == sorted(m for m, _ in curve)
    assert plain["minutes_to_reach"] == curve[0][0]  # every BLEU reaches 0
    assert [p.relative_to(runs).as_posix() for p in runs.glob("*/eval-*-test")] == [
        f"{chosen['run']}/eval-{chosen['checkpoint']}-test"
    ]
    assert (tmp_path / "r.json").is_file()


def test_variants_need_names_of_their_own(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--config", "quickstart", "--variant", "a", "--variant", "a model.dropout=0.2", "--runs", str(tmp_path)])
    assert e.value.code == 2
