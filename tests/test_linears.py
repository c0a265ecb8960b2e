"""The Linear layers decoding swaps in compute what the nn.Linear they replace computes: Int8Linear within int8's
rounding, its parts the whole's rows."""

import pytest
import torch
from torch import nn

from transformer.model import linears
from transformer.model.linears import (
    PACK_SENTENCES,
    Int8Linear,
    IntegerRows,
    LinearParts,
    output_rows,
    swap_linears,
)
from transformer.model.transformer import StackedLinear


def test_int8_linear_is_close_to_the_fp32_one_and_its_parts_are_its_rows():
    torch.manual_seed(0)
    linear = StackedLinear(64, 3 * 64)
    rows = (slice(0, 64), slice(64, 192))
    q, parts = Int8Linear(linear.weight, linear.bias), LinearParts(linear, [(r, Int8Linear) for r in rows])
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


@pytest.fixture(params=["fbgemm", "int_mm"])
def engine(request, monkeypatch):
    """Int8Linear through FBGEMM's fused operator (x86) and through torch._int_mm (where FBGEMM is absent)."""
    if request.param == "fbgemm" and not linears.fbgemm():
        pytest.skip("this torch has no FBGEMM")
    if request.param == "int_mm":
        monkeypatch.setattr(linears, "fbgemm", lambda: False)
    return request.param


def test_an_int8_row_gives_the_same_numbers_alone_and_in_any_batch(engine):
    """Each input row is quantized with its own scale: a row's output does not depend on its neighbours."""
    torch.manual_seed(0)
    q = Int8Linear(torch.randn(96, 64), torch.randn(96))
    rows = torch.randn(256, 64)
    rows[3] *= 100  # a loud neighbour, which would set a whole-batch scale
    rows[5] = 0  # a row of zeros has no scale of its own
    alone = q(rows[:1])
    for n in (8, 64, 256):
        assert torch.equal(q(rows[:n])[:1], alone)
    assert torch.equal(q(rows[5:6])[0], q.bias)


def test_fbgemm_and_int_mm_multiply_the_same_integers(monkeypatch):
    if not linears.fbgemm():
        pytest.skip("this torch has no FBGEMM")
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 64), torch.randn(96), torch.randn(32, 64)
    fused = Int8Linear(weight, bias)
    monkeypatch.setattr(linears, "fbgemm", lambda: False)
    plain = Int8Linear(weight, bias)
    assert torch.equal(fused.weight_int8(), plain.weight_int8())
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)


def test_output_rows_give_the_whole_layers_numbers_for_those_rows(engine):
    torch.manual_seed(0)
    linear, ids = nn.Linear(64, 50), torch.tensor([0, 7, 8, 49])
    x = torch.randn(3, 64)
    torch.testing.assert_close(output_rows(linear, ids)(x), linear(x)[:, ids], rtol=0, atol=1e-6)
    q = Int8Linear(linear.weight, linear.bias)
    packed = output_rows(q, ids, PACK_SENTENCES)
    assert isinstance(packed, Int8Linear)
    for rows in (x[:1], x):  # packed at one scale, the rows' scales after: the same but for that rounding
        torch.testing.assert_close(packed(rows), q(rows)[:, ids], rtol=1e-6, atol=1e-6)
        assert torch.equal(packed(rows[:1]), packed(rows)[:1])
    gathered = output_rows(q, ids, 1)  # fewer sentences than pay for packing: the same integers, summed in fp32
    assert isinstance(gathered, IntegerRows)
    assert torch.equal(gathered(x), packed(x))


def test_integer_rows_are_exact_at_the_largest_sums(engine):
    """The largest sums IntegerRows can meet, every input at its row's peak and every weight at +-127, stay exact:
    the packed int8 product's numbers to the bit, and a layer of more inputs is packed instead."""
    torch.manual_seed(0)
    n = linears.INTEGER_INPUTS
    weight = torch.randn(6, n).sign() * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])[:, None]
    q, ids = Int8Linear(weight, torch.randn(6)), torch.tensor([1, 2, 5])
    aligned = weight[:4].sign() * 7.0  # each row at its peak everywhere: sums of +-n * 63 * 127 with rows 1 and 2
    x = torch.cat([aligned, -aligned, torch.randn(3, n)])
    assert torch.equal(IntegerRows(q, ids)(x), q.rows(ids)(x))
    wider = Int8Linear(torch.randn(4, n + 1), None)
    assert isinstance(output_rows(wider, ids[:2], 1), Int8Linear)
