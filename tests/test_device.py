"""Settings chosen per device: precision: auto, fused Adam where torch has it, one CPU thread for small decoding
batches, no cuDNN attention on CUDA, and no flash attention for short training batches."""

import torch

import pytest

from transformer.device import (FLASH_FROM_LENGTH, SMALL_DECODE_ROWS, check_precision, decoding_threads, fused_adam,
                              resolve_precision, shape_changing_attention, training_attention)
from transformer.errors import ConfigError


def test_fused_adam_on_cpu_and_cuda_only():
    assert fused_adam(torch.device("cpu"))  # torch 2.4+, which the test environment has
    assert fused_adam(torch.device("cuda"))
    assert not fused_adam(torch.device("mps"))


def test_small_cpu_batches_decode_on_one_thread_and_restore_the_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with decoding_threads(torch.device("cpu"), SMALL_DECODE_ROWS - 1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with decoding_threads(torch.device("cpu"), SMALL_DECODE_ROWS):
            assert torch.get_num_threads() == 2
        with decoding_threads(torch.device("cuda"), 1):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


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


@pytest.mark.parametrize("capability, precision", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp16"), ((7, 0), "fp16")])
def test_auto_precision_on_cuda_is_bf16_from_ampere_and_fp16_before(capability, precision, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_precision("auto", torch.device("cuda")) == precision


def test_auto_precision_is_fp32_off_cuda_and_names_pass_through():
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert [resolve_precision(p, torch.device("cpu")) for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="precision 'fp8' is not one of fp32, bf16, fp16"):
        check_precision("fp8", torch.device("cpu"))
