"""Linear layers that decoding swaps into the model for int8 (model.decoding_copy): each computes x W^T + b
as the nn.Linear it replaces does, with W stored in int8.

``Int8Linear``: PyTorch's dynamic quantized linear (FBGEMM on x86), one operator that quantizes its input per
call, multiplies in int8 with int32 sums and returns fp32 with the bias added; one weight scale per output row. An
input's scale is taken over the whole call, so a sentence's output can differ in the last digits with the other
sentences in its batch. (fp32 decodes through the model's own Linear layers: weights laid out for a step's few rows
measured slower inside the model's one step, as bench/README.md records.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn


def swap_linears(module: nn.Module, make: Callable[[nn.Module, nn.Linear], nn.Module]) -> None:
    """Replace every nn.Linear under ``module`` by ``make(its parent, it)``, in place."""
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                setattr(parent, name, make(parent, child))


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
