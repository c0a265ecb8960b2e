"""Beam search's top-k by block maxima finds what topk finds."""

import torch

from transformer.decoding.topk import row_topk


def test_row_topk_equals_topk_on_a_large_vocabulary():
    """The block-maximum shortcut beam search uses finds the same values and tokens as topk."""
    torch.manual_seed(0)
    x = torch.randn(7, 8000).log_softmax(-1)
    x[2, :] = float("-inf")
    x[2, 5] = -0.1  # a row forced to one token, as at max length
    x[3, 1234] = 5.0
    values, index = row_topk(x, 10)
    want_values, want_index = x.topk(10, dim=1)
    assert torch.equal(values, want_values)
    assert torch.equal(index[[0, 1, 3, 4, 5, 6]], want_index[[0, 1, 3, 4, 5, 6]])  # row 2: ties among -inf
    assert index[2, 0] == 5 and index[3, 0] == 1234
