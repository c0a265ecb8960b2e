"""What incremental decoding keeps between steps: the K/V caches."""

from __future__ import annotations

import math

import torch
from torch import Tensor


class DecoderState:
    """What incremental decoding keeps between steps for a batch of rows (as fairseq's incremental state).

    Rows come in groups of ``beam`` consecutive rows per sentence: one at the start, k once beam
    search has widened (``select``).
    cross_kv [sentences, N, 2, h, S, d_k]: encoder-decoder keys and values, computed once per sentence
    and shared by its beams (V is zero for a source of only <PAD>, whose cross-attention output is
    then zero as in training); src_mask likewise holds one entry per sentence.
    self_kv [rows, N, 2, h, capacity, d_k]: self-attention keys and values; the first ``length``
    positions are filled, and the capacity doubles when full. All layers in one row-major tensor make
    reordering one contiguous copy per row.
    """

    def __init__(self, cross_kv: Tensor, src_mask: Tensor, capacity: int = 32):
        sentences, N, _, h, _, d_k = cross_kv.shape
        self.cross_kv, self.src_mask = cross_kv, src_mask
        self.beam = 1
        self.length = 0
        self._buffers: list[Tensor | None] = [None, None]  # behind self_kv, and select's spare (swapped each step)
        self.self_kv = self._view(0, (sentences, N, 2, h, capacity, d_k), cross_kv)

    def _view(self, slot: int, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A tensor of ``shape`` on buffer ``slot``, which is first replaced by a larger one if too small."""
        numel, buffer = math.prod(shape), self._buffers[slot]
        if buffer is None or buffer.numel() < numel:
            self._buffers[slot] = like.new_empty(numel)
        return self._buffers[slot][:numel].view(shape)  # type: ignore[index]

    def select(self, index: Tensor, beam: int | None = None) -> None:
        """Keep rows ``index`` in that order, in place: reorders beams and drops finished sentences.

        Only the filled ``length`` positions are copied, into a spare buffer that then swaps with the
        cache (beam search reorders every step, so copying only what is filled matters).
        ``beam``, when given, is the new number of rows per sentence: beam search decodes its first
        step on one row per sentence (all its beams would be the same) and then widens to k.
        With beam > 1, index must keep each sentence's rows together and the sentences in order (as
        beam search does); the per-sentence tensors are then only touched when sentences leave.
        """
        t = self.length
        spare = self._view(1, (index.numel(), *self.self_kv.shape[1:]), self.self_kv)
        torch.index_select(self.self_kv[..., :t, :], 0, index, out=spare[..., :t, :])
        self.self_kv = spare
        self._buffers.reverse()
        width, self.beam = self.beam, beam or self.beam
        sentences = index[:: self.beam] // width
        if self.beam == 1 or sentences.numel() != self.cross_kv.size(0):
            self.cross_kv = self.cross_kv.index_select(0, sentences)
            self.src_mask = self.src_mask.index_select(0, sentences)

    def reserve(self, length: int) -> None:
        """Make room for ``length`` cached positions."""
        capacity = self.self_kv.size(4)
        if length > capacity:
            old = self.self_kv
            self._buffers[:] = [None, None]  # both too small now; the spare is freed before the bigger cache is made
            self.self_kv = self._view(0, (*old.shape[:4], max(length, 2 * capacity), old.size(5)), old)
            self.self_kv[..., :capacity, :] = old
