"""MFU: the model FLOPs count against torch's own count of a forward and a backward pass, and the card's peak."""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from transformer.config import ModelConfig
from transformer.model.transformer import Transformer
from transformer.training import mfu


def test_the_count_is_torch_s_count_of_the_matmuls():
    """torch's FlopCounterMode, which counts every matmul (attention's too, under SDPA's math kernel), finds
    forward_flops in a forward pass and train_flops, three times as many, in a forward and backward pass."""
    m = ModelConfig(N=2, d_model=32, d_ff=64, h=4, dropout=0.0)
    model = Transformer(m, 50, 0).train()
    B, S, T = 3, 7, 5
    src, tgt = torch.randint(1, 50, (B, S)), torch.randint(1, 50, (B, T))
    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as forward, torch.no_grad():
            model(src, tgt)
        with FlopCounterMode(display=False) as both:
            model(src, tgt).sum().backward()
    assert forward.get_total_flops() == mfu.forward_flops(m, 50, B, S, T)
    assert both.get_total_flops() == mfu.train_flops(m, 50, B, S, T) == 3 * mfu.forward_flops(m, 50, B, S, T)


def test_the_peak_is_the_datasheet_s_for_a_known_card_else_measured(monkeypatch):
    cuda = torch.device("cuda")
    for name, tflops in (
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H200", 989),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA L4", 121),
    ):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert mfu.bf16_peak(cuda) == (tflops * 1e12, f"{name}, datasheet dense bf16")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Card Unknown Here")
    monkeypatch.setattr(mfu, "matmul_peak", lambda dtype, n, repeats, device: 123_000.0)  # GFLOP/s
    peak, source = mfu.bf16_peak(cuda)
    assert peak == 123e12 and "measured" in source
    assert mfu.bf16_peak(torch.device("cpu")) is None
