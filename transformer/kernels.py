"""Code that exists only for speed, kept apart so that model.py and search.py read as the algorithm.

Each piece computes what the plain PyTorch call it stands for computes (the same values, or for
dropout the same distribution); ``python -m bench.levers`` (and ``bench.gpu`` on CUDA) measures them.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, ContextManager

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.decoder_state import BufferPool

if TYPE_CHECKING:
    from transformer.model import Transformer

FLASH_FROM_LENGTH = 256


class Dropout(nn.Dropout):
    """nn.Dropout whose CPU masks come four at a time from random 64-bit integers.

    torch's CPU dropout draws one Bernoulli sample per element. Here each random int64 gives four
    16-bit lanes, and a lane keeps its element when it is at or above the threshold, so the drop
    rate is p rounded to a multiple of 2^-16; the comparison writes 1s and 0s straight into x's
    dtype. On CUDA (a fused kernel) and in eval mode this is nn.Dropout.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p in (0.0, 1.0) or x.device.type != "cpu":
            return super().forward(x)
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
        lanes = bits.view(torch.int16)[:n].view(x.shape)
        keep = torch.ge(lanes, round(self.p * 65536) - 32768, out=torch.empty_like(x))  # 1 or 0, in x's dtype
        return x * keep.mul_(1.0 / (1.0 - self.p))


def unpadded(keep: Tensor) -> bool:
    """Whether a CPU batch's source has no padding, so attention may run with no mask at all.

    Without a mask SDPA does no masking work. On a GPU the question would make the host wait for
    the device, so there the answer is always no.
    """
    return keep.device.type == "cpu" and bool(keep.all())


def attention_kernel(q: Tensor) -> ContextManager:
    """SDPA's plain math kernel for bf16 training on a CPU, whose flash kernel has a slower backward; else SDPA's choice."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and torch.is_grad_enabled():
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def row_topk(x: Tensor, m: int, block: int = 100) -> tuple[Tensor, Tensor]:
    """``x.topk(m, dim=1)`` for rows over a large vocabulary, found through block maxima.

    A row's m largest values lie in the m blocks of ``block`` columns with the largest maxima, so one
    max per block, a top-m over blocks and a top-m over their m * block values find them.
    """
    R, V = x.shape
    if V % block or V < 4 * m * block:
        return x.topk(m, dim=1)
    blocks = x.view(R, V // block, block)
    _, chosen = blocks.amax(-1).topk(m, dim=1)  # [R, m] block numbers
    values, j = blocks.gather(1, chosen[..., None].expand(R, m, block)).view(R, m * block).topk(m, dim=1)
    return values, chosen.gather(1, j // block) * block + j % block


def row_max(x: Tensor, block: int = 100) -> tuple[Tensor, Tensor]:
    """``x.max(dim=1, keepdim=True)`` through block maxima: torch's max with indices is far slower than amax.

    The row's maximum is found among block maxima and only its block is searched for the index.
    Ties go to the first index, as with max. Below 4 rows the plain max is faster.
    """
    R, V = x.shape
    if V % block or R < 4:
        return x.max(dim=1, keepdim=True)
    blocks = x.view(R, V // block, block)
    values, b = blocks.amax(-1).max(dim=1, keepdim=True)  # [R, 1]: the row's maximum and its first block
    within = blocks.gather(1, b[..., None].expand(R, 1, block)).view(R, block).argmax(dim=1, keepdim=True)
    return values, b * block + within


def fused_adam(device: torch.device) -> bool:
    """Whether Adam's fused kernel (one pass over all parameters, not a loop per tensor) runs on ``device``."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and torch.torch_version.TorchVersion(torch.__version__) >= (2, 4)


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


def matmul_weights_in(model: Transformer, dtype: torch.dtype) -> Transformer:
    """A frozen copy of ``model`` whose Linear weights and biases are cast to ``dtype`` once, for decoding under autocast.

    Autocast caches no casts under inference mode, so every decoding step would cast every weight
    again. Cast ahead, the outputs are the same: autocast rounds the same weights the same way. The
    generator gets its own copy of the tied embedding table, so embeddings stay in fp32 as under autocast.
    """
    half = copy.deepcopy(model, {id(model.kv_pool): BufferPool()})  # a pool of its own, not a copy of the buffers
    half.eval().requires_grad_(False)
    half.generator.weight = nn.Parameter(half.generator.weight.detach().to(dtype), requires_grad=False)
    for module in half.modules():
        if isinstance(module, nn.Linear):
            module.to(dtype)
    return half
