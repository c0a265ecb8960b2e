"""Encoder-decoder attention folded into its projections steps as the attention it stands for, on the batches it
folds: one sentence or a few short ones, padded, a source of only <PAD>, beams, sentences leaving the batch; other
batches keep K and V."""

import copy

import pytest
import torch
from steps import step_logits

from transformer.config import ModelConfig
from transformer.decoding.search import beam_search, greedy_search
from transformer.model.cross_fold import FoldedCrossAttention, worth_folding
from transformer.model.decoding_copy import decoding_model, precision_copy
from transformer.model.transformer import Transformer

CPU = torch.device("cpu")


def _model() -> Transformer:
    """A model whose biases are not zero (they are at initialisation), so that the query bias's term counts."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(N=2, d_model=32, d_ff=64, h=4, max_positions=16), 50, 0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def _folded(model: Transformer) -> Transformer:
    """The model with each layer's encoder-decoder attention folded, and nothing else swapped."""
    folded = copy.deepcopy(model)
    for layer, source in zip(folded.decoder.layers, model.decoder.layers):
        layer.cross_attn = FoldedCrossAttention(layer.cross_attn, source.cross_attn)
    return folded


def test_folding_pays_for_few_sentences_only():
    assert worth_folding(1, 15, 4, 256)  # 45 < 256
    assert worth_folding(1, 30, 8, 512)  # the paper's shape, one sentence: 210 < 512
    assert not worth_folding(32, 15, 4, 256)
    assert not worth_folding(3, 30, 8, 512)


@pytest.mark.parametrize("beam", [1, 3])
def test_folded_steps_equal_the_models_steps(beam):
    model = _model()
    folded = _folded(model)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])  # 2 sentences x 4 x (h - 1) < 32: folded
    tokens = torch.randint(3, 50, (2 * beam, 10))
    with torch.inference_mode():
        assert folded.start_state(*folded.encode(src)).cross_mask.dtype != torch.bool
    torch.testing.assert_close(
        step_logits(folded, src, tokens, beam), step_logits(model, src, tokens, beam), rtol=0, atol=1e-5
    )


def test_a_source_of_only_padding_attends_as_in_the_model():
    model = _model()
    src = torch.tensor([[0, 0, 0]])
    tokens = torch.randint(3, 50, (1, 4))
    torch.testing.assert_close(
        step_logits(_folded(model), src, tokens, 1), step_logits(model, src, tokens, 1), rtol=0, atol=1e-5
    )


def test_many_sentences_keep_k_and_v():
    folded = _folded(_model())
    with torch.inference_mode():
        state = folded.start_state(*folded.encode(torch.randint(3, 50, (8, 6))))
    assert state.cross_mask.dtype == torch.bool


def test_whole_sequences_go_through_the_attention_it_stands_for():
    model = _model()
    src, tgt = torch.randint(3, 50, (2, 5)), torch.randint(3, 50, (2, 4))
    with torch.inference_mode():
        torch.testing.assert_close(_folded(model)(src, tgt), model(src, tgt), rtol=0, atol=0)


def test_searches_find_the_same_hypotheses_as_sentences_leave():
    model = _model()
    folded = decoding_model(model, "fp32", CPU)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])  # limits 1 * length + 2: the second sentence leaves first
    # (short hypotheses: an untrained model's long ones are near-ties that float rounding may order either way)

    def greedy(m):
        return [(h.tokens, h.score) for h in greedy_search(m, src, 1, 2, 1.0, 2)]

    def beam(m):
        return [(h.tokens, h.score) for hs in beam_search(m, src, 1, 2, 3, 0.6, 3, 1.0, 2) for h in hs]

    for got, want in ((greedy(folded), greedy(model)), (beam(folded), beam(model))):
        assert [t for t, _ in got] == [t for t, _ in want]  # the same hypotheses, in the same order
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-3)  # fp32 sums in another order


def test_an_int8_copy_folds_its_float_originals_cross_attention_and_unfolded_computes_the_same():
    """int8 steps with cross-attention folded from the fp32 weights: within int8's rounding of the fp32 model, and equal
    to the unfolded int8 copy's (whose query and output projections stay fp32) but for the order of float sums, so a
    batch that folds and one that does not translate alike."""
    model = _model()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    tokens = torch.randint(3, 50, (2, 8))
    want = step_logits(model, src, tokens, 1)
    got = step_logits(decoding_model(model, "int8", CPU), src, tokens, 1)
    unfolded = step_logits(precision_copy(model, "int8"), src, tokens, 1)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    torch.testing.assert_close(got, unfolded, rtol=0, atol=1e-4)


def test_cpu_decoding_folds_in_fp32_and_int8_only():
    model = _model()
    for name, folds in (("fp32", True), ("int8", True), ("bf16", False)):
        cross = decoding_model(model, name, CPU).decoder.layers[0].cross_attn
        assert isinstance(cross, FoldedCrossAttention) == folds
        assert not isinstance(precision_copy(model, name).decoder.layers[0].cross_attn, FoldedCrossAttention)
