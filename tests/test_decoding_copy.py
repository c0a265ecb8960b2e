"""The model as each precision decodes it steps as the model does (to its rounding) and leaves the model alone."""

from __future__ import annotations

import pytest
import torch
from steps import small_model, step_logits
from torch import nn

from transformer.model.cross_fold import FoldedCrossAttention
from transformer.model.decoding_copy import decoding_model, precision_copy
from transformer.model.linears import Int8Linear

CPU = torch.device("cpu")


_model = small_model


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


def test_the_fp32_copy_has_modules_of_its_own_over_the_model_s_tensors():
    model = _model()
    fast = decoding_model(model, "fp32", CPU)
    assert fast.decoder is not model.decoder and fast.encoder is not model.encoder
    assert fast.decoder.layers[0].ff.w_1.weight is model.decoder.layers[0].ff.w_1.weight
    assert fast.encoder.layers[0].self_attn.in_proj.weight is model.encoder.layers[0].self_attn.in_proj.weight
    assert fast.generator.weight is fast.src_embed.weight is model.src_embed.weight
    assert isinstance(fast.decoder.layers[0].cross_attn, FoldedCrossAttention)
    assert isinstance(model.decoder.layers[0].ff.w_1, nn.Linear)
    assert type(model.decoder.layers[0].cross_attn).__name__ == "MultiHeadAttention"
    assert not fast.training


@pytest.mark.parametrize("name", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_copy_leaves_the_mode_of_every_module_of_the_model_as_it_was(name, device):
    """A model in training stays in training, module by module, when a copy is made and when the copy's modules are
    switched back and forth (as a search does): decoding never changes the model as others see it."""
    if name == "int8" and device == "cuda":
        return
    model = _model().train()
    model.encoder.layers[0].eval()  # a mixed state, kept as it is
    modes = [m.training for m in model.modules()]
    copy = decoding_model(model, name, torch.device(device))
    assert not any(m.training for m in copy.modules())
    copy.train()
    copy.eval()
    assert [m.training for m in model.modules()] == modes


def test_the_int8_copy_replaces_every_linear_but_cross_attentions_query_and_output_and_leaves_the_model_alone():
    """fp32 stays where folded encoder-decoder attention computes in fp32 too (its query and output projections)."""
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = precision_copy(model, "int8")
    floats = {id(m) for m in q.modules() if isinstance(m, nn.Linear)}
    crosses = [layer.cross_attn for layer in q.decoder.layers]
    assert floats == {id(c.out_proj) for c in crosses} | {id(c.in_proj.parts[0]) for c in crosses}
    assert all(isinstance(c.in_proj.parts[1], Int8Linear) for c in crosses)
    assert isinstance(q.generator, Int8Linear) and isinstance(q.encoder.layers[0].self_attn.in_proj, Int8Linear)
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


def test_off_the_cpu_fp32_decodes_the_model_s_own_tensors_without_cpu_swaps():
    model = _model()
    copy = decoding_model(model, "fp32", torch.device("cuda"))
    assert copy.decoder.layers[0].ff.w_1.weight is model.decoder.layers[0].ff.w_1.weight
    assert type(copy.decoder.layers[0].cross_attn).__name__ == "MultiHeadAttention"
