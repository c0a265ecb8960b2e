"""bench.gpu_multilingual: every parent and fine-tune is a config tfm accepts, and both stages run on the CPU."""

import json
import tarfile
from pathlib import Path

import pytest

from bench.gpu_multilingual import (
    CONFIG,
    FINE_TUNES,
    GPU,
    PARENTS,
    QUICK_ALPHAS,
    QUICK_PARENTS,
    ZERO_SHOT,
    _choose,
    main,
)
from transformer.config_file import load


def test_every_parent_is_a_config_tfm_accepts():
    for name, sets in PARENTS.items():
        cfg = load(CONFIG, [*GPU, *sets])
        assert cfg.data.tagged and cfg.train.max_steps == 100000, name
    assert {n for names in FINE_TUNES.values() for n in names} <= set(PARENTS)


def _report(bleu: float, alpha: float) -> dict:
    return {"bleu": bleu, "bleu_lc": bleu, "chrf": bleu, "alpha": alpha, "bleu_signature": "sig"}


def _scored(val: dict[str, dict[float, float]], test: dict[str, dict[float, float]]) -> dict:
    return {
        split: {d: {a: _report(b, a) for a, b in by_alpha.items()} for d, by_alpha in found.items()}
        for split, found in (("val", val), ("test", test))
    }


def test_the_checkpoint_is_chosen_on_mean_val_bleu_and_test_is_read_where_val_chose():
    """best/ wins on the mean over both directions though avg3 has the higher de-en and the higher test everywhere;
    each direction's penalty is its own on val, and a zero-shot direction is reported but not averaged."""
    scored = {
        "best": _scored(
            {"de-en": {1.0: 30.0, 3.0: 31.0}, "en-de": {1.0: 28.0, 3.0: 26.0}, "de-fr": {1.0: 1.0, 3.0: 2.0}},
            {"de-en": {1.0: 29.0, 3.0: 29.5}, "en-de": {1.0: 27.0, 3.0: 25.0}, "de-fr": {1.0: 0.5, 3.0: 1.5}},
        ),
        "avg3": _scored(
            {"de-en": {1.0: 32.0, 3.0: 30.0}, "en-de": {1.0: 20.0, 3.0: 21.0}, "de-fr": {1.0: 9.0, 3.0: 9.0}},
            {"de-en": {1.0: 40.0, 3.0: 40.0}, "en-de": {1.0: 40.0, 3.0: 40.0}, "de-fr": {1.0: 40.0, 3.0: 40.0}},
        ),
    }
    result = _choose(scored, ("val", "test"), ["de-en", "en-de"])
    chosen = result["chosen_on_val"]
    assert chosen["checkpoint"] == "best" and chosen["mean_val_bleu"] == 29.5
    picked = {d: (c["alpha"], c["val_bleu"], c["test"]["bleu"]) for d, c in chosen["by_direction"].items()}
    assert picked == {"de-en": (3.0, 31.0, 29.5), "en-de": (1.0, 28.0, 27.0), "de-fr": (3.0, 2.0, 1.5)}
    assert result["val"]["avg3"]["en-de"] == {"1.0": 20.0, "3.0": 21.0}


def test_a_checkpoint_missing_a_direction_on_val_is_not_chosen():
    scored = {"best": _scored({"de-en": {1.0: 30.0}}, {"de-en": {1.0: 30.0}})}
    assert "chosen_on_val" not in _choose(scored, ("val", "test"), ["de-en", "en-de"])


@pytest.mark.slow
def test_parents_fine_tunes_and_choices_on_val(small_multi30k: Path, tmp_path: Path, monkeypatch):
    """--quick: both parents train, each fine-tune starts from its parent, every candidate is scored on val and test,
    and each direction's choice is the highest val BLEU among the runs that translate it."""
    monkeypatch.delenv("TFM_MULTI30K")  # it outranks --data-dir, and the runs read the small copy
    out = tmp_path / "out"
    args = ["--data", str(small_multi30k), "--device", "cpu", "--quick", "--runs", str(tmp_path / "runs")]
    result = main([*args, "--out", str(out), "--minutes", "2", "--fine-tune-minutes", "2"])
    assert list(result["parents"]) == list(QUICK_PARENTS)
    assert sorted(result["fine_tunes"]) == ["de-en-from-six", "de-en-from-x-en-b16k", "en-de-from-six"]
    for group in ("parents", "fine_tunes"):
        for name, run in result[group].items():
            assert run["exit_code"] == 0 and run["updates"] == 4, name
            chosen = run["chosen_on_val"]
            assert set(run["val"]) == {"best", "avg3"} and chosen["checkpoint"] in run["val"]
            for d, picked in chosen["by_direction"].items():
                if d != "-".join(ZERO_SHOT):
                    assert picked["val_bleu"] == max(run["val"][chosen["checkpoint"]][d].values()), (name, d)
                assert picked["test"]["alpha"] == picked["alpha"] and picked["alpha"] in QUICK_ALPHAS
    assert "-".join(ZERO_SHOT) in result["parents"]["six"]["chosen_on_val"]["by_direction"]
    assert "-".join(ZERO_SHOT) not in result["parents"]["x-en-b16k"]["chosen_on_val"]["by_direction"]
    init = (tmp_path / "runs" / "de-en-from-six" / "config.yaml").read_text()
    assert str(tmp_path / "runs" / "six" / "best") in init
    for d in FINE_TUNES:
        best = max(
            run["chosen_on_val"]["by_direction"][d]["val_bleu"]
            for group in ("parents", "fine_tunes")
            for run in result[group].values()
            if d in run["chosen_on_val"]["by_direction"]
        )
        assert result["chosen_on_val"][d]["val_bleu"] == best
    assert json.loads((out / "gpu-multilingual.json").read_text())["chosen_on_val"] == result["chosen_on_val"]
    with tarfile.open(out / "runs.tgz") as tar:
        names = tar.getnames()
    assert "six/log.jsonl" in names and any(n.startswith("eval/de-en-from-six.best/") for n in names)


def test_parents_not_in_the_list_are_refused(tmp_path: Path):
    with pytest.raises(SystemExit) as e:
        main(["--parents", "six,seven", "--out", str(tmp_path)])
    assert e.value.code == 2
