"""Beam search's top-k over a large vocabulary, kept apart so that search.py reads as the algorithm: the same values
and tokens as ``topk``, faster (``python -m bench.levers`` measures it)."""

from __future__ import annotations

from torch import Tensor


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
