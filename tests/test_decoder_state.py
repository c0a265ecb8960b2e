"""The decoder state: its K/V cache grows keeping what it holds, and select reorders and drops rows."""

import torch

from transformer.model.decoder_state import DecoderState


def state(sentences: int = 2) -> DecoderState:
    """A state for N=1, h=2, S=3, d_k=4 with a small capacity."""
    cross, mask = torch.randn(sentences, 1, 2, 2, 3, 4), torch.ones(sentences, 1, 1, 1, 3, dtype=torch.bool)
    return DecoderState(cross, mask, h=2, d_k=4, capacity=4)


def test_growth_keeps_the_cached_positions():
    s = state()
    s.self_kv[..., :4, :] = torch.arange(4.0)[:, None]
    s.reserve(5)
    assert s.self_kv.size(4) == 8
    torch.testing.assert_close(s.self_kv[0, 0, 0, 0, :4, 0], torch.arange(4.0))


def test_select_reorders_rows_and_their_sentences():
    s = state(sentences=3)
    s.length = 2
    s.self_kv[..., :2, :] = torch.arange(3.0).view(3, 1, 1, 1, 1, 1)  # row i holds i at its filled positions
    cross = s.cross.clone()
    s.select(torch.tensor([2, 0]), torch.tensor([2, 0]))  # sentence 1 leaves, 2 and 0 swap
    assert s.self_kv[:, 0, 0, 0, :2, 0].tolist() == [[2.0, 2.0], [0.0, 0.0]]
    torch.testing.assert_close(s.cross, cross[[2, 0]])
    assert s.cross_mask.size(0) == 2


def test_widening_to_beams_keeps_one_entry_per_sentence():
    s = state(sentences=2)
    s.length = 1
    s.self_kv[..., :1, :] = torch.arange(2.0).view(2, 1, 1, 1, 1, 1)
    cross = s.cross.clone()
    s.select(torch.tensor([0, 0, 0, 1, 1, 1]))  # 3 beams a sentence: rows widen, sentences stay
    assert s.self_kv[:, 0, 0, 0, 0, 0].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert torch.equal(s.cross, cross) and s.cross_mask.size(0) == 2
