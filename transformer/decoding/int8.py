"""int8 decoding on the CPU: each Linear's weight stored in int8 and its input quantized at every call.

The matmuls are PyTorch's dynamic quantized linear on its quantized engine (FBGEMM on x86): one operator that
quantizes its input per call, multiplies in int8 with int32 sums and returns fp32 with the bias added,
so a decoding step has no more operators than in fp32. Weights get one scale per output row. The rest
of the network (embeddings, LayerNorm, softmax, attention over the cached keys and values) stays fp32.
An input's scale is taken over the whole call, so a sentence's output can differ in the last digits with the
other sentences in its batch.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from transformer.errors import ConfigError
from transformer.model.transformer import StackedLinear, Transformer

INT8 = "int8"  # the name a command's --precision gives it


def _packed(weight: Tensor, bias: Tensor | None) -> object:
    """``weight`` rounded to int8 with one scale per output row, packed with ``bias`` for the quantized engine."""
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12).double()
    zero = torch.zeros(w.size(0), dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated (pytorch#184982); only this packing makes one
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())


class Int8Linear(nn.Module):
    """An nn.Linear for inference with int8 weights; ``part`` applies some output rows, as StackedLinear's does."""

    def __init__(self, linear: nn.Linear, parts: tuple[slice, ...] = ()) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._whole = _packed(linear.weight, linear.bias)
        b = linear.bias
        self._parts = {(s.start, s.stop): _packed(linear.weight[s], None if b is None else b[s]) for s in parts}

    def forward(self, x: Tensor) -> Tensor:
        return self._apply(x, self._whole)

    def part(self, x: Tensor, rows: slice) -> Tensor:
        return self._apply(x, self._parts[rows.start, rows.stop])

    @staticmethod
    def _apply(x: Tensor, packed: object) -> Tensor:
        # reduce_range: 7-bit inputs, so that int8 products cannot overflow on x86 without VNNI (as torch.ao's does)
        return torch.ops.quantized.linear_dynamic(x, packed, True)


def check_int8(device: torch.device) -> None:
    """int8 decoding needs the CPU and a quantized engine in this torch build; else a one-line error."""
    if device.type != "cpu":
        raise ConfigError(f"precision int8 decodes on the CPU only, the device is {device.type}; use --device cpu")
    if torch.backends.quantized.engine == "none":
        raise ConfigError("precision int8: this torch build has no quantized engine (FBGEMM/QNNPACK); use fp32")


def int8_copy(model: Transformer) -> Transformer:
    """A frozen copy of ``model`` for decoding whose Linear layers hold int8 weights (the generator its own copy of
    a tied embedding table, which stays fp32 for the embeddings)."""
    q = copy.deepcopy(model).eval().requires_grad_(False)
    for module in list(q.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.Linear):
                stacked = isinstance(child, StackedLinear)  # an attention's in_proj: queries or keys and values alone
                parts = (module.query_rows, module.key_value_rows) if stacked else ()
                setattr(module, name, Int8Linear(child, parts))
    return q
