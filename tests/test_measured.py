"""auto where no rule decides: measured once per machine and shape and kept; decoding's on CUDA by the rule."""

from __future__ import annotations

import json

import pytest
import torch
from steps import small_model

from transformer import measured
from transformer.config import ModelConfig
from transformer.measured import (
    MARGIN,
    alternated,
    cache_path,
    choose,
    decoding_precision,
    decoding_seconds,
    measured_training,
    speedups,
    training_seconds,
)

CPU = torch.device("cpu")
SHAPE = ModelConfig(N=1, d_model=32, d_ff=64, h=2)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


_model = small_model


@pytest.mark.parametrize("capability, name", [((9, 0), "bf16"), ((7, 5), "fp16")])
def test_decoding_auto_on_cuda_follows_the_rule(capability, name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert decoding_precision("auto", _model(), torch.device("cuda"), print) == name


def _seconds(**speed: float) -> dict[str, dict[int, float]]:
    """Times for 1 and 8 sentences of precisions that run at ``speed`` times fp32's."""
    return {"fp32": {1: 1.0, 8: 4.0}, **{name: {1: 1.0 / s, 8: 4.0 / s} for name, s in speed.items()}}


def test_the_fastest_wins_only_by_the_margin():
    assert choose(speedups(_seconds(bf16=0.8, int8=2.0))) == "int8"
    assert choose(speedups(_seconds(bf16=MARGIN, int8=1.1))) == "bf16"
    assert choose(speedups(_seconds(bf16=1.1, int8=1.1))) == "fp32"
    mixed = {"fp32": {1: 1.0, 8: 4.0}, "int8": {1: 2.0, 8: 1.0}}  # slower for one sentence, faster for eight
    assert speedups(mixed)["int8"] == pytest.approx(2**0.5)


def test_measurements_time_every_precision_through_the_clock_they_are_given():
    ticks = iter(range(10_000))
    seconds = training_seconds(SHAPE, 300, rounds=3, clock=lambda: float(next(ticks)))
    assert seconds == {"fp32": {"step": 1.0}, "bf16": {"step": 1.0}}  # each step reads the clock twice
    names = ("fp32", "bf16", "int8")
    seconds = decoding_seconds(_model(), names, rounds=3, clock=lambda: float(next(ticks)))
    assert seconds == {name: {1: 1.0, 8: 1.0} for name in names}


def test_real_measurements_give_every_time(cache_home):
    seconds = training_seconds(SHAPE, 300, rounds=1)
    assert set(seconds) == {"fp32", "bf16"} and all(s["step"] > 0 for s in seconds.values())
    seconds = decoding_seconds(_model(), ("fp32", "bf16", "int8"), rounds=1)
    assert all(s > 0 for by_n in seconds.values() for s in by_n.values())


def test_decoding_auto_is_measured_once_per_shape_then_kept(cache_home, monkeypatch):
    monkeypatch.setattr(measured, "decoding_seconds", lambda model, names: _seconds(bf16=0.9, int8=1.6))
    said = []
    assert decoding_precision("auto", _model(), CPU, said.append) == "int8"
    assert said and "int8 at 1.60x" in said[0] and str(cache_path()) in said[0]
    monkeypatch.setattr(measured, "decoding_seconds", lambda model, names: pytest.fail("measured again"))
    assert decoding_precision("auto", _model(), CPU, print) == "int8"
    assert decoding_precision("fp32", _model(), CPU, print) == "fp32"  # only auto is measured
    monkeypatch.setattr(measured, "decoding_seconds", lambda model, names: _seconds(bf16=1.0, int8=1.0))
    assert decoding_precision("auto", _model(d_model=64), CPU, print) == "fp32"  # another shape on its own
    kept = json.loads(cache_path().read_text())
    assert sorted(v["precision"] for k, v in kept.items() if k.startswith("decoding |")) == ["fp32", "int8"]


def test_training_auto_is_measured_once_per_shape_then_kept(cache_home, monkeypatch):
    monkeypatch.setattr(measured, "training_seconds", lambda m, v: {"fp32": {"step": 2.0}, "bf16": {"step": 1.0}})
    said = []
    assert measured_training(SHAPE, 300, said.append) == "bf16"
    assert said and "bf16 at 2.00x train" in said[0]
    monkeypatch.setattr(measured, "training_seconds", lambda m, v: pytest.fail("measured again"))
    assert measured_training(SHAPE, 300, print) == "bf16"
    other = ModelConfig(N=1, d_model=64, d_ff=128, h=2)
    monkeypatch.setattr(measured, "training_seconds", lambda m, v: {"fp32": {"step": 1.0}, "bf16": {"step": 1.0}})
    assert measured_training(other, 300, print) == "fp32"
    assert len(json.loads(cache_path().read_text())) == 2


@pytest.mark.parametrize("content", ["{", "[]", '{"x": 1}', "null"])
def test_a_broken_cache_is_measured_again(cache_home, monkeypatch, content):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(content)
    monkeypatch.setattr(measured, "training_seconds", lambda m, v: {"fp32": {"step": 1.0}, "bf16": {"step": 1.0}})
    assert measured_training(SHAPE, 300, print) == "fp32"
    assert json.loads(cache_path().read_text())


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(measured, "training_seconds", lambda m, v: {"fp32": {"step": 3.0}, "bf16": {"step": 1.0}})
    assert measured_training(SHAPE, 300, print) == "bf16"


def test_every_name_runs_once_untimed_then_in_an_order_reversed_every_other_round():
    calls = []

    def run(name: str) -> int:
        calls.append(name)
        return len(calls)

    results = alternated(("a", "b", "c"), run, rounds=3)
    assert calls == ["a", "b", "c", "a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert results == {"a": [4, 9, 10], "b": [5, 8, 11], "c": [6, 7, 12]}  # the untimed first runs are not kept
