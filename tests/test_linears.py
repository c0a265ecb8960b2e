"""The Linear layers decoding swaps in compute what the nn.Linear they replace computes: StepLinear to float
rounding for one row and for several, whole or in parts, with oneDNN's packed weights and without; Int8Linear within
int8's rounding, its parts the whole's rows."""

import pytest
import torch
from torch import nn

from transformer.model import linears
from transformer.model.linears import Int8Linear, LinearParts, StepLinear, swap_linears
from transformer.model.transformer import StackedLinear


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_step_linear_is_the_linear_it_stands_for(p, onednn, monkeypatch):
    """x W^T + b for one row and for several, 2-D and 3-D, whole or in the parts of a StackedLinear, with oneDNN's
    packed weights and with F.linear where torch lacks them; an output width that p does not divide gets fewer
    blocks; the weights are the layer's own."""
    if onednn and not linears.onednn_linear_available():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(linears, "onednn_linear_available", lambda: onednn)
    torch.manual_seed(0)
    stacked = StackedLinear(8, 24)
    step = StepLinear(stacked.weight, stacked.bias, p)
    parts = LinearParts(stacked, (slice(0, 8), slice(8, 24)), lambda w, b: StepLinear(w, b, p))
    assert step.p == p and StepLinear(torch.randn(10, 8), None, 3).p == 2
    assert (step.packed is not None) == onednn and step.weight.data_ptr() == stacked.weight.data_ptr()
    for x in (torch.randn(1, 8), torch.randn(1, 1, 8), torch.randn(5, 8), torch.randn(3, 2, 8)):
        torch.testing.assert_close(step(x), stacked(x))
        for rows in (slice(0, 8), slice(8, 24)):
            torch.testing.assert_close(parts.part(x, rows), stacked.part(x, rows))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the Linear would under autocast, not a dtype error
        x = torch.randn(4, 8)
        torch.testing.assert_close(step(x.bfloat16()), stacked(x.bfloat16()), atol=0.05, rtol=0.05)
    table = torch.randn(12, 8)  # no bias, as the output table
    for x in (torch.randn(1, 8), torch.randn(4, 8)):
        torch.testing.assert_close(StepLinear(table, None, p)(x), x @ table.t())


def test_int8_linear_is_close_to_the_fp32_one_and_its_parts_are_its_rows():
    torch.manual_seed(0)
    linear = StackedLinear(64, 3 * 64)
    rows = (slice(0, 64), slice(64, 192))
    q, parts = Int8Linear(linear.weight, linear.bias), LinearParts(linear, rows, Int8Linear)
    x = torch.randn(7, 5, 64)
    want, got = linear(x).detach(), q(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    for part in rows:  # each part is packed from the same rows and scales: the same numbers as the whole's rows
        torch.testing.assert_close(parts.part(x, part), got[..., part], rtol=0, atol=1e-5)


def test_swap_linears_replaces_every_linear_in_place():
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2)))
    swap_linears(net, lambda parent, linear: Int8Linear(linear.weight, linear.bias))
    assert [type(m).__name__ for m in net.modules()].count("Int8Linear") == 2
    assert not any(isinstance(m, nn.Linear) for m in net.modules())
