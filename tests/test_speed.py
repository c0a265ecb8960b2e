"""Speed-only code of the model and training computes what the plain PyTorch it stands for computes: dropout, fused
Adam where torch has it, SDPA kernel choices on CUDA, a decoding copy called straight through forward."""

import torch
from steps import step_logits

from transformer.config import ModelConfig
from transformer.model.decoding_copy import precision_copy
from transformer.model.speed import (
    FLASH_FROM_LENGTH,
    Dropout,
    called_directly,
    shape_changing_attention,
    training_attention,
)
from transformer.model.transformer import DecoderLayer, Encoder, Transformer
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


def test_modules_called_directly_compute_the_same():
    """A decoding copy called straight through forward: the same logits; its submodules and parameters plain
    attributes, still the registered ones."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(N=2, d_model=16, d_ff=32, h=2), 40, 0).eval()
    copy = precision_copy(model, "fp32")
    src, tokens = torch.randint(3, 40, (2, 5)), torch.randint(3, 40, (2, 6))
    want = step_logits(copy, src, tokens, 1)
    called_directly(copy)
    torch.testing.assert_close(step_logits(copy, src, tokens, 1), want, rtol=0, atol=0)
    layer = copy.decoder.layers[0]
    assert type(layer).__call__ is DecoderLayer.forward and isinstance(layer, DecoderLayer)
    assert vars(layer)["ff"] is layer._modules["ff"] and vars(layer.norms[0])["weight"] is layer.norms[0].weight
    assert type(model.encoder) is Encoder and type(model.decoder.layers[0]) is DecoderLayer  # the original's own
