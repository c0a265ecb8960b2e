"""The lean decoding step computes what Transformer.decode_step computes, for every layout the Translator gives it:
the model as stored, its decoder laid out for CPU steps, int8 and bf16 copies; post- and pre-norm, untied
embeddings, beams sharing a sentence's cross-attention, positions past the precomputed table."""

import pytest
import torch
from steps import step_logits

from transformer.decoding.int8 import int8_copy
from transformer.decoding.lean_step import LeanDecoding
from transformer.decoding.search import beam_search, greedy_search
from transformer.decoding.speed import for_cpu_decoding, matmul_weights_in
from transformer.model.transformer import Transformer


def _model(norm_first: bool = False, tie: bool = True) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        50, 50, 0, N=2, d_model=32, d_ff=64, h=4, norm_first=norm_first, tie_embeddings=tie, max_positions=8
    ).eval()


@pytest.mark.parametrize("norm_first,tie", [(False, True), (True, False)])
@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("layout", ["stored", "cpu", "int8"])
def test_lean_steps_equal_the_models_steps(norm_first, tie, beam, layout):
    model = _model(norm_first, tie)
    copy = {"stored": model, "cpu": for_cpu_decoding(model, 2), "int8": int8_copy(model)}[layout]
    src = torch.randint(3, 50, (2, 6))
    src[1, 4:] = 0  # padding
    tokens = torch.randint(3, 50, (2 * beam, 12))  # 12 positions: past the table of 8
    want = step_logits(copy, src, tokens, beam)
    torch.testing.assert_close(step_logits(LeanDecoding(copy), src, tokens, beam), want, rtol=0, atol=1e-5)


def test_lean_steps_under_bf16_autocast_equal_the_models():
    model = matmul_weights_in(_model(), torch.bfloat16)
    src, tokens = torch.randint(3, 50, (3, 7)), torch.randint(3, 50, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = step_logits(model, src, tokens, 1)
        got = step_logits(LeanDecoding(model), src, tokens, 1)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_searches_through_the_lean_step_find_the_same_hypotheses():
    model = for_cpu_decoding(_model(), 1)
    lean = LeanDecoding(model)
    assert not lean.training  # made from a model in eval mode, so that search need not set it again
    src = torch.randint(3, 50, (5, 6))
    src[2, 3:] = 0

    def greedy(m):
        return [(h.tokens, h.score) for h in greedy_search(m, src, 1, 2, max_len_b=10)]

    def beam(m):
        return [(h.tokens, h.score) for hs in beam_search(m, src, 1, 2, beam=4, nbest=2) for h in hs]

    for got, want in ((greedy(lean), greedy(model)), (beam(lean), beam(model))):
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)
