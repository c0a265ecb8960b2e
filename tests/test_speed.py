"""Speed-only code computes what the plain PyTorch it stands for computes: dropout, block-wise top-k and argmax,
the decoder's matrices split for decoding, the CPU no-mask shortcut (tested in test_model), fused Adam where torch
has it, and SDPA kernel choices on CUDA."""

import pytest
import torch
from torch import nn

from transformer.decoding import speed
from transformer.decoding.search import beam_search, greedy_search
from transformer.decoding.speed import StepLinear, StepParts, for_cpu_decoding, row_topk
from transformer.model.speed import FLASH_FROM_LENGTH, Dropout, shape_changing_attention, training_attention
from transformer.model.transformer import StackedLinear, Transformer
from transformer.training.schedule import fused_adam


def test_cpu_dropout_drops_p_scales_the_rest_and_follows_the_seed():
    """The CPU fast path: drop rate p (to 2^-16), kept values scaled by 1 / (1 - p), seeded, identity in eval."""
    x = torch.ones(1001, 333)
    drop = Dropout(0.1)
    torch.manual_seed(3)
    y = drop(x)
    assert abs((y == 0).float().mean().item() - 0.1) < 0.003
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.9))
    torch.manual_seed(3)
    assert torch.equal(drop(x), y)
    assert torch.equal(drop.eval()(x), x)
    z = torch.ones(7, requires_grad=True)
    Dropout(0.5)(z).sum().backward()
    assert set(z.grad.tolist()) <= {0.0, 2.0}


def test_row_topk_equals_topk_on_a_large_vocabulary():
    """The block-maximum shortcut beam search uses finds the same values and tokens as topk."""
    torch.manual_seed(0)
    x = torch.randn(7, 8000).log_softmax(-1)
    x[2, :] = float("-inf")
    x[2, 5] = -0.1  # a row forced to one token, as at max length
    x[3, 1234] = 5.0
    values, index = row_topk(x, 10)
    want_values, want_index = x.topk(10, dim=1)
    assert torch.equal(values, want_values)
    assert torch.equal(index[[0, 1, 3, 4, 5, 6]], want_index[[0, 1, 3, 4, 5, 6]])  # row 2: ties among -inf
    assert index[2, 0] == 5 and index[3, 0] == 1234


def test_fused_adam_on_cpu_and_cuda_only():
    assert fused_adam(torch.device("cpu"))  # torch 2.4+, which the test environment has
    assert fused_adam(torch.device("cuda"))
    assert not fused_adam(torch.device("mps"))


def test_decoding_on_cuda_leaves_cudnn_attention_out_and_restores_it():
    """The backend switches are process-wide flags, readable without a GPU."""
    cuda = torch.backends.cuda
    assert cuda.cudnn_sdp_enabled()
    with shape_changing_attention(torch.device("cuda")):
        assert not cuda.cudnn_sdp_enabled()
        assert cuda.flash_sdp_enabled() and cuda.mem_efficient_sdp_enabled() and cuda.math_sdp_enabled()
    assert cuda.cudnn_sdp_enabled()
    with shape_changing_attention(torch.device("cpu")):
        assert cuda.cudnn_sdp_enabled()


def _sdpa_flags() -> tuple[bool, bool, bool, bool]:
    cuda = torch.backends.cuda
    return cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()


def test_training_leaves_flash_out_below_256_positions_and_cudnn_always():
    with training_attention(torch.device("cuda"), FLASH_FROM_LENGTH - 1):
        assert _sdpa_flags() == (False, False, True, True)
    with training_attention(torch.device("cuda"), FLASH_FROM_LENGTH):
        assert _sdpa_flags() == (False, True, True, True)
    with training_attention(torch.device("cpu"), 8):
        assert _sdpa_flags() == (True, True, True, True)
    assert _sdpa_flags() == (True, True, True, True)


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_step_linear_is_the_linear_it_stands_for(p, onednn, monkeypatch):
    """x W^T + b for one row and for several, 2-D and 3-D, whole or in the parts of a StackedLinear, with oneDNN's
    packed weights and with F.linear where torch lacks them; an output width that p does not divide gets fewer
    blocks; the weights are the layer's own."""
    if onednn and not speed.onednn_linear_available():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(speed, "onednn_linear_available", lambda: onednn)
    torch.manual_seed(0)
    stacked = StackedLinear(8, 24)
    step, parts = StepLinear(stacked.weight, stacked.bias, p), StepParts(stacked, p, (slice(0, 8), slice(8, 24)))
    assert step.p == p and StepLinear(torch.randn(10, 8), None, 3).p == 2
    assert (step.packed is not None) == onednn and step.weight.data_ptr() == stacked.weight.data_ptr()
    for x in (torch.randn(1, 8), torch.randn(1, 1, 8), torch.randn(5, 8), torch.randn(3, 2, 8)):
        torch.testing.assert_close(step(x), stacked(x))
        for rows in (slice(0, 8), slice(8, 24)):
            torch.testing.assert_close(parts.part(x, rows), stacked.part(x, rows))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the Linear would under autocast, not a dtype error
        x = torch.randn(4, 8)
        torch.testing.assert_close(step(x.bfloat16()), stacked(x.bfloat16()), atol=0.05, rtol=0.05)
    table = torch.randn(12, 8)  # no bias, as the output table
    for x in (torch.randn(1, 8), torch.randn(4, 8)):
        torch.testing.assert_close(StepLinear(table, None, p)(x), x @ table.t())


@pytest.mark.parametrize("p", [1, 2])
def test_the_decoder_for_cpu_decoding_decodes_as_the_model_and_leaves_it_alone(p):
    """for_cpu_decoding: the same logits (to float rounding) and hypotheses; the encoder, embeddings and norms
    shared, the original's layers and tied table untouched; applied twice, once."""
    torch.manual_seed(0)
    model = Transformer(300, 300, 0, N=2, d_model=32, d_ff=64, h=4, dropout=0.0).eval()
    fast = for_cpu_decoding(model, p)
    assert isinstance(fast.generator, StepLinear) and for_cpu_decoding(fast, p) is fast
    assert model.generator.weight is model.src_embed.weight and isinstance(model.decoder.layers[0].ff.w_1, nn.Linear)
    assert fast.encoder is model.encoder and fast.src_embed is model.src_embed
    assert fast.decoder.layers[0].norms[0].weight is model.decoder.layers[0].norms[0].weight
    x = torch.randn(5, 32)
    torch.testing.assert_close(fast.generator(x), model.generator(x))
    src = torch.randint(3, 300, (6, 9))
    want = greedy_search(model, src, 1, 2, max_len_b=12)
    got = greedy_search(fast, src, 1, 2, max_len_b=12)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)
    want = [[h.tokens for h in hs] for hs in beam_search(model, src, 1, 2, beam=4, nbest=2, max_len_b=12)]
    assert [[h.tokens for h in hs] for hs in beam_search(fast, src, 1, 2, beam=4, nbest=2, max_len_b=12)] == want
