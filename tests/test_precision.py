"""Precisions: names and what each needs refused in one line; auto by rule where one decides, else measured once per
machine and shape and kept; the model as each precision decodes it steps as the model does (to its rounding) and
leaves the model alone."""

from __future__ import annotations

import json

import pytest
import torch
from steps import step_logits
from torch import nn

from transformer import precision
from transformer.config import ModelConfig
from transformer.errors import ConfigError
from transformer.model.cross_fold import FoldedCrossAttention
from transformer.model.linears import Int8Linear
from transformer.model.transformer import Transformer
from transformer.precision import (
    MARGIN,
    alternated,
    autocast,
    cache_path,
    check_precision,
    choose,
    decoding_model,
    decoding_precision,
    decoding_seconds,
    measured_training,
    speedups,
    training_precision,
    training_seconds,
)

CPU = torch.device("cpu")
SHAPE = ModelConfig(N=1, d_model=32, d_ff=64, h=2)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _model(norm_first: bool = False, tie: bool = True, d_model: int = 32) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        50, 50, 0, N=2, d_model=d_model, d_ff=64, h=4, norm_first=norm_first, tie_embeddings=tie, max_positions=8
    ).eval()


# ----- names and checks -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("training, names", [(True, "fp32, bf16, fp16, auto"), (False, "fp32, bf16, fp16, int8, auto")])
def test_unknown_names_are_one_line_naming_the_known(training, names):
    with pytest.raises(ConfigError, match=f"precision 'fp8' is not one of {names}; pick one of them"):
        check_precision("fp8", CPU, training)
    if training:
        with pytest.raises(ConfigError, match="precision 'int8' is not one of"):
            check_precision("int8", CPU, training)
    else:
        check_precision("int8", CPU, training)


def test_fp16_needs_a_gpu_and_int8_the_cpu():
    with pytest.raises(ConfigError, match="precision: fp16 needs a CUDA GPU but the device is cpu"):
        check_precision("fp16", CPU, training=True)
    check_precision("fp16", torch.device("cuda"), training=False)
    with pytest.raises(ConfigError, match="int8 decodes on the CPU only"):
        check_precision("int8", torch.device("cuda"), training=False)


def test_autocast_only_below_fp32():
    assert not torch.is_autocast_enabled("cpu")
    for name, on in (("fp32", False), ("int8", False), ("bf16", True)):
        with autocast(name, CPU):
            assert torch.is_autocast_enabled("cpu") == on


# ----- auto --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capability, name", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp16"), ((7, 0), "fp16")])
def test_auto_on_cuda_is_bf16_from_ampere_and_fp16_before(capability, name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert training_precision("auto", torch.device("cuda")) == name
    assert decoding_precision("auto", _model(), torch.device("cuda"), print) == name


@pytest.mark.parametrize(
    "amx, measured, name", [(True, "fp32", "bf16"), (False, "bf16", "bf16"), (False, "fp32", "fp32")]
)
def test_auto_training_on_a_cpu_is_bf16_with_amx_else_what_was_measured(amx, measured, name, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert training_precision("auto", CPU, lambda: measured) == name
    assert training_precision("auto", CPU) == ("bf16" if amx else "fp32")  # unmeasured: fp32
    assert training_precision("auto", torch.device("mps"), lambda: "bf16") == "fp32"
    assert [training_precision(p, CPU, lambda: "bf16") for p in ("fp32", "bf16")] == ["fp32", "bf16"]


def test_auto_is_fp32_on_a_torch_that_cannot_tell_amx(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert training_precision("auto", CPU) == "fp32"


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
    monkeypatch.setattr(precision, "decoding_seconds", lambda model, names: _seconds(bf16=0.9, int8=1.6))
    said = []
    assert decoding_precision("auto", _model(), CPU, said.append) == "int8"
    assert said and "int8 at 1.60x" in said[0] and str(cache_path()) in said[0]
    monkeypatch.setattr(precision, "decoding_seconds", lambda model, names: pytest.fail("measured again"))
    assert decoding_precision("auto", _model(), CPU, print) == "int8"
    assert decoding_precision("fp32", _model(), CPU, print) == "fp32"  # only auto is measured
    monkeypatch.setattr(precision, "decoding_seconds", lambda model, names: _seconds(bf16=1.0, int8=1.0))
    assert decoding_precision("auto", _model(d_model=64), CPU, print) == "fp32"  # another shape on its own
    kept = json.loads(cache_path().read_text())
    assert sorted(v["precision"] for k, v in kept.items() if k.startswith("decoding |")) == ["fp32", "int8"]


def test_training_auto_is_measured_once_per_shape_then_kept(cache_home, monkeypatch):
    monkeypatch.setattr(precision, "training_seconds", lambda m, v: {"fp32": {"step": 2.0}, "bf16": {"step": 1.0}})
    said = []
    assert measured_training(SHAPE, 300, said.append) == "bf16"
    assert said and "bf16 at 2.00x train" in said[0]
    monkeypatch.setattr(precision, "training_seconds", lambda m, v: pytest.fail("measured again"))
    assert measured_training(SHAPE, 300, print) == "bf16"
    other = ModelConfig(N=1, d_model=64, d_ff=128, h=2)
    monkeypatch.setattr(precision, "training_seconds", lambda m, v: {"fp32": {"step": 1.0}, "bf16": {"step": 1.0}})
    assert measured_training(other, 300, print) == "fp32"
    assert len(json.loads(cache_path().read_text())) == 2


@pytest.mark.parametrize("content", ["{", "[]", '{"x": 1}', "null"])
def test_a_broken_cache_is_measured_again(cache_home, monkeypatch, content):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(content)
    monkeypatch.setattr(precision, "training_seconds", lambda m, v: {"fp32": {"step": 1.0}, "bf16": {"step": 1.0}})
    assert measured_training(SHAPE, 300, print) == "fp32"
    assert json.loads(cache_path().read_text())


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(precision, "training_seconds", lambda m, v: {"fp32": {"step": 3.0}, "bf16": {"step": 1.0}})
    assert measured_training(SHAPE, 300, print) == "bf16"


def test_every_name_runs_once_untimed_then_in_an_order_reversed_every_other_round():
    calls = []

    def run(name: str) -> int:
        calls.append(name)
        return len(calls)

    results = alternated(("a", "b", "c"), run, rounds=3)
    assert calls == ["a", "b", "c", "a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert results == {"a": [4, 9, 10], "b": [5, 8, 11], "c": [6, 7, 12]}  # the untimed first runs are not kept


# ----- the model as each precision decodes it ---------------------------------------------------------------------


@pytest.mark.parametrize("norm_first,tie", [(False, True), (True, False)])
@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("name", ["fp32", "int8"])
def test_cpu_copies_step_as_the_model_does(norm_first, tie, beam, name):
    """Post- and pre-norm, untied embeddings, beams sharing a sentence's encoder-decoder attention, positions past
    the table of 8; two sentences of few positions, so that encoder-decoder attention runs folded."""
    model = _model(norm_first, tie)
    src = torch.randint(3, 50, (2, 6))
    src[1, 4:] = 0  # padding
    tokens = torch.randint(3, 50, (2 * beam, 12))
    want = step_logits(model, src, tokens, beam)
    got = step_logits(decoding_model(model, name, CPU), src, tokens, beam)
    tolerance = 1e-5 if name == "fp32" else 0.05 * want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance)


def test_the_fp32_cpu_copy_shares_all_but_its_decoder_and_leaves_the_model_alone():
    model = _model()
    fast = decoding_model(model, "fp32", CPU)
    assert fast.generator is model.generator and fast.decoder is not model.decoder
    assert fast.decoder.layers[0].ff.w_1.weight is model.decoder.layers[0].ff.w_1.weight
    assert isinstance(fast.decoder.layers[0].cross_attn, FoldedCrossAttention)
    assert fast.encoder is model.encoder and fast.src_embed is model.src_embed
    assert fast.decoder.layers[0].norms[0].weight is model.decoder.layers[0].norms[0].weight
    assert model.generator.weight is model.src_embed.weight and isinstance(model.decoder.layers[0].ff.w_1, nn.Linear)
    assert type(model.decoder.layers[0].cross_attn).__name__ == "MultiHeadAttention"
    assert not fast.training


def test_the_int8_copy_replaces_every_linear_and_leaves_the_model_alone():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = decoding_model(model, "int8", CPU)
    assert not [m for m in q.modules() if isinstance(m, nn.Linear)]
    assert [m for m in q.modules() if isinstance(m, Int8Linear)]
    assert model.generator.weight is model.src_embed.weight  # still tied, still fp32
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_bf16_copy_casts_its_weights_once_and_steps_as_autocast_over_the_model():
    model = _model()
    half = decoding_model(model, "bf16", CPU)
    assert {m.weight.dtype for m in half.modules() if isinstance(m, nn.Linear)} == {torch.bfloat16}
    assert half.src_embed.weight.dtype == torch.float32 and model.generator.weight is model.src_embed.weight
    src, tokens = torch.randint(3, 50, (3, 7)), torch.randint(3, 50, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = step_logits(model, src, tokens, 1), step_logits(half, src, tokens, 1)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_off_the_cpu_fp32_decodes_the_model_itself():
    model = _model()
    assert decoding_model(model, "fp32", torch.device("cuda")) is model
