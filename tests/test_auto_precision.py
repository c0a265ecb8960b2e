"""--precision auto for decoding: on a CPU the precision measured fastest (below fp32 only by the margin), once per
machine and shape, kept beside training's verdicts; training's rule off the CPU; the Translator decodes in it."""

import json

import pytest
import torch

from transformer.decoding import auto_precision
from transformer.decoding.auto_precision import MARGIN, choose, decoding_precision, measure, speedups
from transformer.measured import cache_path
from transformer.model.transformer import Transformer


def _model(d_model: int = 32) -> Transformer:
    torch.manual_seed(0)
    return Transformer(60, 60, 0, N=1, d_model=d_model, d_ff=64, h=4).eval()


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _seconds(**speed: float) -> dict[str, dict[int, float]]:
    """Times for 1 and 8 sentences of precisions that run at ``speed`` times fp32's."""
    return {"fp32": {1: 1.0, 8: 4.0}, **{name: {1: 1.0 / s, 8: 4.0 / s} for name, s in speed.items()}}


def test_the_fastest_wins_only_by_the_margin():
    assert choose(_seconds(bf16=0.8, int8=2.0)) == "int8"
    assert choose(_seconds(bf16=MARGIN, int8=1.1)) == "bf16"
    assert choose(_seconds(bf16=1.1, int8=1.1)) == "fp32"
    mixed = {"fp32": {1: 1.0, 8: 4.0}, "int8": {1: 2.0, 8: 1.0}}  # slower for one sentence, faster for eight
    assert speedups(mixed)["int8"] == pytest.approx(2**0.5)


def test_measure_times_every_precision_and_batch_through_the_clock_it_is_given():
    ticks = iter(range(10_000))
    seconds = measure(_model(), ("fp32", "bf16", "int8"), rounds=3, clock=lambda: float(next(ticks)))
    assert seconds == {name: {1: 1.0, 8: 1.0} for name in ("fp32", "bf16", "int8")}


def test_a_real_measurement_gives_every_time(cache_home):
    seconds = measure(_model(), auto_precision.candidates(), rounds=1)
    assert set(seconds) == set(auto_precision.candidates()) and "int8" in seconds
    assert all(s > 0 for by_n in seconds.values() for s in by_n.values())


def test_the_verdict_is_measured_once_per_shape_then_read_from_the_cache(cache_home, monkeypatch):
    monkeypatch.setattr(auto_precision, "measure", lambda model, names: _seconds(bf16=0.9, int8=1.6))
    said = []
    cpu = torch.device("cpu")
    assert decoding_precision(_model(), cpu, said.append) == "int8"
    assert said and "int8 at 1.60x" in said[0] and str(cache_path()) in said[0]
    monkeypatch.setattr(auto_precision, "measure", lambda model, names: pytest.fail("measured again"))
    assert decoding_precision(_model(), cpu) == "int8"
    monkeypatch.setattr(auto_precision, "measure", lambda model, names: _seconds(bf16=1.0, int8=1.0))
    assert decoding_precision(_model(d_model=64), cpu) == "fp32"  # another shape is measured on its own
    kept = json.loads(cache_path().read_text())
    assert sorted(v["precision"] for k, v in kept.items() if k.startswith("decoding |")) == ["fp32", "int8"]


def test_off_the_cpu_auto_is_trainings_rule_and_measures_nothing(monkeypatch):
    monkeypatch.setattr(auto_precision, "measure", lambda model, names: pytest.fail("measured"))
    assert decoding_precision(_model(), torch.device("mps")) == "fp32"
