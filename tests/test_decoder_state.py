"""The decoder state's buffer pool: tightest fit, the largest kept, memory back when a state is gone, never shared,
inference-mode buffers only lent in inference mode."""

import gc

import torch

from transformer.model.decoder_state import BufferPool, DecoderState


def state(pool: BufferPool, sentences: int = 2) -> DecoderState:
    """A state for N=1, h=2, S=3, d_k=4 with a small capacity."""
    return DecoderState(
        torch.randn(sentences, 1, 2, 2, 3, 4), torch.ones(sentences, 1, 1, 3, dtype=torch.bool), pool, capacity=4
    )


def test_pool_lends_the_tightest_fit_and_keeps_the_largest():
    pool, like = BufferPool(keep=2), torch.empty(0)
    small, large, middle = torch.empty(10), torch.empty(30), torch.empty(20)
    pool.give([small, None, large, middle])
    assert pool.take(15, like) is middle
    assert pool.take(25, like) is large
    assert pool.take(5, like).numel() == 5  # the 10 was dropped: only the two largest were kept
    assert pool.take(8, torch.empty(0, dtype=torch.float64)).dtype == torch.float64


def test_state_memory_goes_back_to_the_pool_and_is_reused():
    pool = BufferPool()
    first = state(pool)
    first.length = 1
    first.select(torch.tensor([0, 0, 1, 1]), beam=2)  # widens: a spare buffer joins the cache's
    used = {first.self_kv.data_ptr(), first._buffers[1].data_ptr()}
    del first
    gc.collect()
    second = state(pool)
    assert second.self_kv.data_ptr() in used
    third = state(pool)  # while second lives, its buffer is not lent again
    assert third.self_kv.data_ptr() != second.self_kv.data_ptr()


def test_growth_keeps_the_cached_positions():
    s = state(BufferPool())
    s.self_kv[..., :4, :] = torch.arange(4.0)[:, None]
    s.reserve(5)
    assert s.self_kv.size(4) == 8
    torch.testing.assert_close(s.self_kv[0, 0, 0, 0, :4, 0], torch.arange(4.0))


def test_inference_buffers_are_lent_only_in_inference_mode():
    pool, like = BufferPool(), torch.empty(0)
    with torch.inference_mode():
        made = torch.empty(10)
    pool.give([made])
    with torch.no_grad():
        lent = pool.take(10, like)
    assert lent is not made and not lent.is_inference()
    lent.zero_()  # writable outside inference mode
    with torch.inference_mode():
        assert pool.take(10, like) is made
