"""Speed settings chosen per device: fused Adam where torch has it."""

import torch

from transformer.device import fused_adam


def test_fused_adam_on_cpu_and_cuda_only():
    assert fused_adam(torch.device("cpu"))  # torch 2.4+, which the test environment has
    assert fused_adam(torch.device("cuda"))
    assert not fused_adam(torch.device("mps"))

