"""Cross-attention folded into its projections gives the model's own steps and searches, for the batches it is
used on: one sentence or a few short ones, padded, a source of only <PAD>, beams, sentences leaving the batch."""

import pytest
import torch
from steps import step_logits

from transformer.decoding.cross_fold import FoldedState, worth_folding
from transformer.decoding.int8 import int8_copy
from transformer.decoding.lean_step import LeanDecoding
from transformer.decoding.precision import decoding_model
from transformer.decoding.search import beam_search, greedy_search
from transformer.decoding.speed import for_cpu_decoding
from transformer.model.transformer import Transformer


def _model() -> Transformer:
    """A model whose biases are not zero (they are at initialisation), so that the query bias's term counts."""
    torch.manual_seed(0)
    model = Transformer(50, 50, 0, N=2, d_model=32, d_ff=64, h=4, max_positions=16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def test_folding_pays_for_few_sentences_only():
    assert worth_folding(1, 15, 4, 256)  # 45 < 256
    assert worth_folding(1, 30, 8, 512)  # the paper's shape, one sentence: 210 < 512
    assert not worth_folding(32, 15, 4, 256)
    assert not worth_folding(3, 30, 8, 512)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("layout", ["stored", "cpu"])
def test_folded_steps_equal_the_models_steps(beam, layout):
    model = _model()
    copy = {"stored": model, "cpu": for_cpu_decoding(model, 2)}[layout]
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])  # 2 sentences x 4 x (h - 1) < 32: folded
    tokens = torch.randint(3, 50, (2 * beam, 10))
    folded = LeanDecoding(copy, fold=model)
    with torch.inference_mode():
        assert isinstance(folded.start_state(*folded.encode(src)), FoldedState)
    want = step_logits(model, src, tokens, beam)
    torch.testing.assert_close(step_logits(folded, src, tokens, beam), want, rtol=0, atol=1e-5)


def test_a_source_of_only_padding_attends_as_in_the_model():
    model = _model()
    src = torch.tensor([[0, 0, 0]])
    tokens = torch.randint(3, 50, (1, 4))
    got = step_logits(LeanDecoding(model, fold=model), src, tokens, 1)
    torch.testing.assert_close(got, step_logits(model, src, tokens, 1), rtol=0, atol=1e-5)


def test_many_sentences_keep_the_unfolded_state():
    model = _model()
    folded = LeanDecoding(model, fold=model)
    with torch.inference_mode():
        state = folded.start_state(*folded.encode(torch.randint(3, 50, (8, 6))))
    assert type(state).__name__ == "DecoderState"


def test_searches_find_the_same_hypotheses_as_sentences_leave():
    model = _model()
    folded = LeanDecoding(for_cpu_decoding(model, 2), fold=model)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])  # limits 1 * length + 2: the second sentence leaves first

    def greedy(m):
        return [(h.tokens, h.score) for h in greedy_search(m, src, 1, 2, 1.0, 2)]

    def beam(m):
        return [(h.tokens, h.score) for hs in beam_search(m, src, 1, 2, 3, nbest=3) for h in hs]

    for got, want in ((greedy(folded), greedy(model)), (beam(folded), beam(model))):
        assert [t for t, _ in got] == [t for t, _ in want]  # the same hypotheses, in the same order
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-3)  # fp32 sums in another order


def test_an_int8_copy_folds_its_float_originals_cross_attention():
    """int8 steps with cross-attention folded from the fp32 weights: within int8's rounding of the fp32 model, and
    closer to it than int8's own cross-attention projections are."""
    model = _model()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    tokens = torch.randint(3, 50, (2, 8))
    want = step_logits(model, src, tokens, 1)
    q = int8_copy(model)
    folded = LeanDecoding(q, fold=model)
    with torch.inference_mode():
        assert isinstance(folded.start_state(*folded.encode(src)), FoldedState)
    got, unfolded = step_logits(folded, src, tokens, 1), step_logits(LeanDecoding(q), src, tokens, 1)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got - want).abs().mean() < (unfolded - want).abs().mean()


def test_cpu_decoding_folds_in_fp32_and_int8():
    model = _model()
    assert decoding_model(model, "fp32", torch.device("cpu")).fold
    assert decoding_model(model, "int8", torch.device("cpu")).fold
    assert not decoding_model(model, "bf16", torch.device("cpu")).fold
