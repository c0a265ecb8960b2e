"""precision: auto on a CPU without AMX: bf16 only when it measured faster by the margin, measured once per machine
and shape, the verdict cached (a broken or unwritable cache only means measuring again)."""

from __future__ import annotations

import json

import pytest

from transformer.config import ModelConfig
from transformer.training import cpu_precision
from transformer.training.cpu_precision import MARGIN, cache_path, choose, faster_cpu_precision, measure

SHAPE = ModelConfig(N=1, d_model=32, d_ff=64, h=2)
VOCAB = 300


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_bf16_needs_to_win_by_the_margin():
    assert choose({"fp32": 1.0, "bf16": 1.0 / MARGIN}) == "bf16"
    assert choose({"fp32": 1.0, "bf16": 0.99}) == "fp32"
    assert choose({"fp32": 1.0, "bf16": 2.0}) == "fp32"


def test_measure_times_each_precision_through_the_clock_it_is_given():
    ticks = iter(range(1000))
    seconds = measure(SHAPE, VOCAB, rounds=3, clock=lambda: float(next(ticks)))
    assert seconds == {"fp32": 1.0, "bf16": 1.0}  # each step reads the clock twice, one tick apart


def test_the_verdict_is_measured_once_then_read_from_the_cache(cache_home, monkeypatch):
    monkeypatch.setattr(cpu_precision, "measure", lambda model, vocab: {"fp32": 2.0, "bf16": 1.0})
    said = []
    assert faster_cpu_precision(SHAPE, VOCAB, said.append) == "bf16"
    assert said and "bf16" in said[0] and str(cache_path()) in said[0]
    saved = json.loads(cache_path().read_text())
    assert [v["precision"] for v in saved.values()] == ["bf16"]
    monkeypatch.setattr(cpu_precision, "measure", lambda model, vocab: pytest.fail("measured again"))
    assert faster_cpu_precision(SHAPE, VOCAB) == "bf16"
    other = ModelConfig(N=1, d_model=64, d_ff=128, h=2)  # another shape is measured on its own
    monkeypatch.setattr(cpu_precision, "measure", lambda model, vocab: {"fp32": 1.0, "bf16": 1.0})
    assert faster_cpu_precision(other, VOCAB) == "fp32"
    assert len(json.loads(cache_path().read_text())) == 2


@pytest.mark.parametrize("content", ["{", "[]", '{"x": 1}', "null"])
def test_a_broken_cache_is_measured_again(cache_home, monkeypatch, content):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(content)
    monkeypatch.setattr(cpu_precision, "measure", lambda model, vocab: {"fp32": 1.0, "bf16": 1.0})
    assert faster_cpu_precision(SHAPE, VOCAB) == "fp32"
    assert json.loads(cache_path().read_text())


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(cpu_precision, "measure", lambda model, vocab: {"fp32": 3.0, "bf16": 1.0})
    assert faster_cpu_precision(SHAPE, VOCAB) == "bf16"


def test_a_real_measurement_gives_both_times(cache_home):
    seconds = measure(SHAPE, VOCAB, rounds=1)
    assert set(seconds) == {"fp32", "bf16"} and all(s > 0 for s in seconds.values())
    assert faster_cpu_precision(SHAPE, VOCAB) in ("fp32", "bf16")
