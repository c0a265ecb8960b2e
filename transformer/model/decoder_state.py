"""What incremental decoding keeps between steps: the K/V caches."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class DecoderState:
    """What incremental decoding keeps between steps for a batch of rows (as fairseq's incremental state).

    A sentence's rows are consecutive: one at the start, as many as its beams once a search widens it (``select``);
    how many is the search's business, not the state's.
    cross [sentences, N, ...] and cross_mask [sentences, N, ...]: what each layer's encoder-decoder attention reads
    of the source (MultiHeadAttention.memory_state: K, V and the mask), computed once per sentence and shared by its
    rows.
    output: the output layer of the target ids every step scores (a lexical shortlist's), or None: the whole one.
    self_kv [rows, N, 2, h, capacity, d_k]: self-attention keys and values; the first ``length``
    positions are filled, and the capacity doubles when full. All layers in one row-major tensor make
    reordering one contiguous copy per row.
    """

    def __init__(self, cross: Tensor, cross_mask: Tensor, h: int, d_k: int, capacity: int = 32):
        sentences, N = cross.shape[:2]
        self.cross, self.cross_mask = cross, cross_mask
        self.output: nn.Module | None = None  # the output layer of the ids steps score, if not the model's own
        self.length = 0
        self._buffers: list[Tensor | None] = [None, None]  # behind self_kv, and select's spare (swapped each step)
        self.self_kv = self._view(0, (sentences, N, 2, h, capacity, d_k), cross)

    def _view(self, slot: int, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A tensor of ``shape`` on buffer ``slot``, which is first replaced by a larger one if too small."""
        numel, buffer = math.prod(shape), self._buffers[slot]
        if buffer is None or buffer.numel() < numel:
            self._buffers[slot] = like.new_empty(numel)
        return self._buffers[slot][:numel].view(shape)  # type: ignore[index]

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows ``rows`` in that order and, of the per-sentence tensors, sentences ``sentences`` (None: all, as
        they are), in place: reorders beams, widens a sentence's one row to its beams, drops finished sentences.

        Only the filled ``length`` positions are copied, into a spare buffer that then swaps with the
        cache (beam search reorders every step, so copying only what is filled matters).
        """
        t = self.length
        spare = self._view(1, (rows.numel(), *self.self_kv.shape[1:]), self.self_kv)
        torch.index_select(self.self_kv[..., :t, :], 0, rows, out=spare[..., :t, :])
        self.self_kv = spare
        self._buffers.reverse()
        if sentences is not None:
            self.cross = self.cross.index_select(0, sentences)
            self.cross_mask = self.cross_mask.index_select(0, sentences)

    def reserve(self, length: int) -> None:
        """Make room for ``length`` cached positions."""
        capacity = self.self_kv.size(4)
        if length > capacity:
            old = self.self_kv
            self._buffers[:] = [None, None]  # both too small now; the spare is freed before the bigger cache is made
            self.self_kv = self._view(0, (*old.shape[:4], max(length, 2 * capacity), old.size(5)), old)
            self.self_kv[..., :capacity, :] = old
