"""Linear layers that decoding swaps into the model (transformer.precision chooses which): each computes x W^T + b
as the nn.Linear it replaces does, with its weights laid out for a CPU's decoding steps or stored in int8.

A decoding step multiplies a few rows by every weight matrix, so reading the weights is what it waits on.
``StepLinear`` (fp32): one row is multiplied by W as stored, cut into ``p`` blocks of output rows applied as one
batched matmul so that p threads each read a block; more rows go through oneDNN's linear on weights packed once
(the kernel torch.compile's CPU backend gives frozen Linear layers), F.linear where this torch lacks it.
``Int8Linear``: PyTorch's dynamic quantized linear (FBGEMM on x86), one operator that quantizes its input per
call, multiplies in int8 with int32 sums and returns fp32 with the bias added; one weight scale per output row. An
input's scale is taken over the whole call, so a sentence's output can differ in the last digits with the other
sentences in its batch.
"""

from __future__ import annotations

import platform
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PACK_ROWS = 32  # the rows oneDNN packs the weights for; measured as fast from 2 rows to 160 as packing for each


def swap_linears(module: nn.Module, make: Callable[[nn.Module, nn.Linear], nn.Module]) -> None:
    """Replace every nn.Linear under ``module`` by ``make(its parent, it)``, in place."""
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                setattr(parent, name, make(parent, child))


def onednn_linear_available() -> bool:
    """Whether this is an x86 CPU (where it was measured) and torch has oneDNN's linear on packed weights."""
    ops = torch.ops.mkldnn
    return (
        platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and all(hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight"))
    )


class StepLinear(nn.Module):
    """x W^T + b for fp32 decoding on the CPU, for ``p`` threads; the same product up to float rounding. It holds
    the layer's own weight and bias (oneDNN's packed weights are one more copy)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, p: int) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.p = max(d for d in range(1, p + 1) if self.out_features % d == 0)
        w = weight.detach()
        b = torch.zeros(self.out_features, dtype=w.dtype, device=w.device) if bias is None else bias.detach()
        self.weight, self.bias = w, b
        self.blocks, self.block_bias = w.view(self.p, -1, self.in_features), b.view(self.p, -1, 1)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) if onednn_linear_available() else None

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2:
            return self.forward(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        if x.size(0) == 1:
            return torch.baddbmm(self.block_bias, self.blocks, x.t().expand(self.p, -1, -1)).view(1, -1)
        if self.packed is not None and x.dtype == self.weight.dtype:  # not under an autocast
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _int8_packed(weight: Tensor, bias: Tensor | None) -> object:
    """``weight`` rounded to int8 with one scale per output row, packed with ``bias`` for the quantized engine."""
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12).double()
    zero = torch.zeros(w.size(0), dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated (pytorch#184982); only this packing makes one
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())


class Int8Linear(nn.Module):
    """x W^T + b with W stored in int8, fp32 in and out."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self._packed = _int8_packed(weight, bias)

    def forward(self, x: Tensor) -> Tensor:
        # reduce_range: 7-bit inputs, so that int8 products cannot overflow on x86 without VNNI (as torch.ao's does)
        return torch.ops.quantized.linear_dynamic(x, self._packed, True)


class LinearParts(nn.Module):
    """A StackedLinear that decoding applies only in parts (encoder-decoder attention: its query rows at every step,
    its key and value rows once per sentence), one layer per part made by ``make(weight rows, bias rows)``."""

    def __init__(self, linear: nn.Linear, parts: tuple[slice, ...], make: Callable[[Tensor, Tensor], nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(make(linear.weight[s], linear.bias[s]) for s in parts)
        self._forwards = {(s.start, s.stop): m.forward for s, m in zip(parts, self.parts)}

    def part(self, x: Tensor, rows: slice) -> Tensor:
        """x through the stacked maps' output rows ``rows`` alone, as StackedLinear.part."""
        return self._forwards[rows.start, rows.stop](x)
