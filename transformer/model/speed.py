"""Code of the model that exists only for speed, kept apart so that transformer.py reads as the paper.

Each piece computes what the plain PyTorch call it stands for computes (the same values, or for
dropout the same distribution); ``python -m bench.levers`` (and ``bench.gpu`` on CUDA) measures them.
"""

from __future__ import annotations

import contextlib
import functools
from typing import ContextManager

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

FLASH_FROM_LENGTH = 256


class Dropout(nn.Dropout):
    """nn.Dropout whose CPU masks come four at a time from random 64-bit integers.

    torch's CPU dropout draws one Bernoulli sample per element. Here each random int64 gives four
    16-bit lanes, and a lane keeps its element when it is at or above the threshold, so the drop
    rate is p rounded to a multiple of 2^-16; the comparison writes 1s and 0s straight into x's
    dtype. On CUDA (a fused kernel) this is nn.Dropout; in eval mode, as nn.Dropout, the identity, without its call
    into F.dropout (a decoding step passes through a dozen dropouts).
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        if self.p in (0.0, 1.0) or x.device.type != "cpu":
            return super().forward(x)
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
        lanes = bits.view(torch.int16)[:n].view(x.shape)
        keep = torch.ge(lanes, round(self.p * 65536) - 32768, out=torch.empty_like(x))  # 1 or 0, in x's dtype
        return x * keep.mul_(1.0 / (1.0 - self.p))


def attention_kernel(q: Tensor) -> ContextManager:
    """SDPA's plain math kernel for bf16 training on a CPU, whose flash kernel has a slower backward; else SDPA's
    choice."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and torch.is_grad_enabled():
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def shape_changing_attention(device: torch.device) -> ContextManager:
    """SDPA without its cuDNN backend on CUDA, for attention whose shapes change at every call.

    cuDNN attention builds an execution plan for each new shape; incremental decoding grows the key
    length by one every step, and unpadded training batches rarely repeat a shape. Flash,
    memory-efficient and math kernels need no plans (measured by ``python -m bench.gpu``).
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def training_attention(device: torch.device, length: int) -> ContextManager:
    """SDPA's kernels on CUDA for a whole-sequence pass whose longest sequence has ``length`` positions.

    Never cuDNN (see ``shape_changing_attention``), and flash only from 256 positions: below, the
    memory-efficient kernel is faster (``python -m bench.gpu``, its flash section).
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    if length < FLASH_FROM_LENGTH:
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    return shape_changing_attention(device)


def called_directly(module: nn.Module) -> None:
    """Make a copy of the model that only decodes cheap to call: each submodule, parameter and buffer becomes a plain
    attribute, found without nn.Module.__getattr__, and each module is called straight through its forward, without
    nn.Module's hook machinery (a copy has no hooks). A
    decoding step of one row calls some 45 modules and makes some 100 such lookups, which cost a tenth of the step;
    what each module computes is unchanged."""
    module.__dict__.update({**module._modules, **module._parameters, **module._buffers})
    module.__class__ = _called_directly(type(module))
    for child in module._modules.values():
        if child is not None:
            called_directly(child)


@functools.cache
def _called_directly(cls: type[nn.Module]) -> type[nn.Module]:
    """``cls`` with ``__call__`` its forward."""
    return type(cls.__name__, (cls,), {"__call__": cls.forward, "__module__": cls.__module__})
