"""Linear layers that decoding swaps into the model for int8 (model.decoding_copy): each computes x W^T + b
as the nn.Linear it replaces does, with W stored in int8.

``Int8Linear``: int8 weights with one scale per output row, and each input row quantized with a scale of its own.
A scale over the whole call, as PyTorch's dynamic quantized linear takes it, would make a sentence's translation
depend on the other sentences of its batch. Each row is divided by its largest magnitude and then quantized at one
fixed scale, which lets FBGEMM (x86) quantize, multiply and scale back in one operator on every x86 CPU, with or
without AVX-512 VNNI; ``torch._int_mm`` multiplies the same integers where FBGEMM is absent. (fp32 decodes through
the model's own Linear layers: weights laid out for a step's few rows measured slower inside the model's one step,
as bench/README.md records.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

# A row divided by its largest magnitude lies in [-1, 1] and is quantized as round(63 x) + 64, in [1, 127]: 7 bits,
# as FBGEMM quantizes activations where AVX2 sums pairs of products in int16, so no sum saturates on any x86 CPU.
_STEPS, _ZERO = 63, 64
_FUSED = "linear_with_input_q_dq_qweight_dq_output_fp32"  # quantize x, multiply in int8, give fp32: one operator
PACK_SENTENCES = 2  # a shortlist's int8 output layer is packed for batches of this many sentences or more
INTEGER_INPUTS = 2**24 // (_STEPS * 127)  # most inputs whose int8 sums fp32 holds exactly (IntegerRows)


def fbgemm() -> bool:
    """Whether this torch runs FBGEMM's quantized operators (x86 builds), which Int8Linear multiplies through."""
    return torch.backends.quantized.engine in ("x86", "fbgemm") and hasattr(torch.ops.quantized, _FUSED)


def _unit_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's largest magnitude [R, 1] (a zero row's taken as tiny) and the rows divided by it, in [-1, 1]: how an
    int8 layer's input rows are brought to the one scale they are quantized at."""
    # abs().amax, not linalg.vector_norm(inf), which reduces each row without vectorizing: one operator fewer,
    # but many times slower once a call has more than a few rows (an encoder's, a beam's, a batch's).
    peak = rows.abs().amax(1, keepdim=True).clamp_min_(1e-30)
    return peak, rows / peak


def swap_linears(module: nn.Module, make: Callable[[nn.Module, nn.Linear], nn.Module]) -> None:
    """Replace every nn.Linear under ``module`` by ``make(its parent, it)``, in place."""
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                setattr(parent, name, make(parent, child))


class Int8Linear(nn.Module):
    """x W^T + b with W stored in int8 (one scale per output row) and each row of x quantized to int8 on its own (one
    scale per row, as int8 engines quantize tokens): an int8 x int8 product summed in int32, then scaled back to
    fp32. A row's output depends on that row alone, so a sentence translates the same whatever else is in its batch.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
        q = torch.round(w / scale[:, None]).to(torch.int8)
        self._hold(q, scale, torch.zeros(w.size(0)) if bias is None else bias.detach().float().clone())

    def _hold(self, q: Tensor, scale: Tensor, bias: Tensor, scaled_after: bool = False) -> None:
        """Keep int8 weights q [out, in] (packed for FBGEMM where it runs), their rows' scales and the bias; with
        ``scaled_after``, FBGEMM's weights are packed at one scale and the rows' scales multiply the outputs."""
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", bias)
        self._packed, self._unpacked, self._scaled_after = None, None, scaled_after
        if fbgemm():
            with warnings.catch_warnings():  # quantized tensors are how FBGEMM's operators take their weights
                warnings.simplefilter("ignore", UserWarning)
                if scaled_after:
                    w = torch._make_per_tensor_quantized_tensor(q, 1.0, 0)
                else:
                    zero = torch.zeros(len(scale), dtype=torch.long)
                    w = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
                self._packed = torch.ops.quantized.linear_prepack(w, None)
        else:
            self.register_buffer("weight_t", q.t().contiguous())
            self.register_buffer("out_scale", scale / _STEPS)

    def weight_int8(self) -> Tensor:
        """The int8 weights [out, in]; unpacked from FBGEMM's layout once, then kept (a shortlist reads them per
        batch)."""
        if self._packed is None:
            return self.weight_t.t()
        if self._unpacked is None:
            self._unpacked = torch.ops.quantized.linear_unpack(self._packed)[0].int_repr()
        return self._unpacked

    def rows(self, ids: Tensor) -> Int8Linear:
        """The layer of outputs ``ids`` alone (a lexical shortlist's, made anew for each batch), from the same int8
        rows and scales. FBGEMM packs them at one scale, their own scales multiplying the outputs after, since a scale
        per row packs several times slower: the whole layer's numbers for those rows but for the rounding of that
        product."""
        part = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(part)
        picked = (t.index_select(0, ids) for t in (self.weight_int8(), self.weight_scale, self.bias))
        part._hold(*picked, scaled_after=True)
        return part

    def forward(self, x: Tensor) -> Tensor:
        peak, unit = _unit_rows(x.reshape(-1, self.in_features))
        if self._packed is not None:
            # torch.ops looks for __torch_function__ on every argument, and on FBGEMM's packed weights the lookup fails
            # through a C++ exception, which costs more than a small layer's product; no tensor here overrides it.
            with torch._C.DisableTorchFunctionSubclass():
                out = getattr(torch.ops.quantized, _FUSED)(unit, 1 / _STEPS, _ZERO, self._packed)
            if self._scaled_after:
                out = out.mul_(self.weight_scale)
            out = torch.addcmul(self.bias, out, peak)
        else:
            q = torch.round(unit * _STEPS).to(torch.int8)
            out = torch.addcmul(self.bias, torch._int_mm(q, self.weight_t).to(torch.float32), peak * self.out_scale)
        return out.view(*x.shape[:-1], self.out_features)


class LinearParts(nn.Module):
    """A StackedLinear that decoding applies only in parts (encoder-decoder attention: its query rows at every step,
    its key and value rows once per sentence), each part a layer that its ``make(weight rows, bias rows)`` builds."""

    def __init__(self, linear: nn.Linear, parts: list[tuple[slice, Callable[[Tensor, Tensor], nn.Module]]]):
        super().__init__()
        self.parts = nn.ModuleList(make(linear.weight[s], linear.bias[s]) for s, make in parts)
        self._forwards = {(s.start, s.stop): m.forward for (s, _), m in zip(parts, self.parts)}

    def part(self, x: Tensor, rows: slice) -> Tensor:
        """x through the stacked maps' output rows ``rows`` alone, as StackedLinear.part."""
        return self._forwards[rows.start, rows.stop](x)


class IntegerRows(nn.Module):
    """Outputs ``ids`` of ``layer`` (an Int8Linear) computed in fp32 on the integers the int8 product multiplies: each
    input row quantized as Int8Linear quantizes it, times the rows' int8 weights held as floats. Every partial sum is
    an integer below 2^24 (for up to INTEGER_INPUTS inputs), which fp32 holds exactly in any order of summing, and the
    sums are scaled back as the packed rows scale them: ``layer.rows(ids)``'s numbers to the bit, from a gather of the
    rows where packing them would cost more than a few rows' steps save."""

    def __init__(self, layer: Int8Linear, ids: Tensor) -> None:
        super().__init__()
        self.in_features = layer.in_features
        self.weight_t = layer.weight_int8().index_select(0, ids).t().float()
        self.scale, self.bias = layer.weight_scale.index_select(0, ids), layer.bias.index_select(0, ids)
        self._fused = layer._packed is not None  # how the layer's own product scales its sums back
        self.out_scale = self.scale / _STEPS  # as _int_mm's path holds it

    def forward(self, x: Tensor) -> Tensor:
        peak, unit = _unit_rows(x.reshape(-1, self.in_features))
        sums = torch.round(unit * _STEPS) @ self.weight_t  # FBGEMM's q minus its zero point; _int_mm's q
        if self._fused:  # FBGEMM gives the product at one scale, then Int8Linear multiplies by the rows' own
            out = torch.addcmul(self.bias, sums.mul_(1 / _STEPS).mul_(self.scale), peak)
        else:
            out = torch.addcmul(self.bias, sums, peak * self.out_scale)
        return out.view(*x.shape[:-1], -1)


def output_rows(linear: nn.Module, ids: Tensor, sentences: int = PACK_SENTENCES) -> nn.Module:
    """The layer computing outputs ``ids`` of ``linear`` (an nn.Linear in any dtype, or an Int8Linear) alone, from
    the same weights: a lexical shortlist's output layer (decoding.shortlist), for a batch of ``sentences``. An int8
    layer's rows are packed anew for each batch, which costs more than the steps of fewer than PACK_SENTENCES
    sentences save: those get the same numbers from IntegerRows."""
    if isinstance(linear, Int8Linear):
        if sentences < PACK_SENTENCES and linear.in_features <= INTEGER_INPUTS:
            return IntegerRows(linear, ids)
        return linear.rows(ids)
    with torch.device("meta"):
        part = nn.Linear(linear.in_features, len(ids), bias=linear.bias is not None)
    part.weight = nn.Parameter(linear.weight.detach().index_select(0, ids), requires_grad=False)
    if linear.bias is not None:
        part.bias = nn.Parameter(linear.bias.detach().index_select(0, ids), requires_grad=False)
    return part


def float_linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """An fp32 nn.Linear holding a copy of ``weight`` and ``bias`` (rows of another layer's)."""
    with torch.device("meta"):
        linear = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None)
    linear.weight = nn.Parameter(weight.detach().float().clone(), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().float().clone(), requires_grad=False)
    return linear
