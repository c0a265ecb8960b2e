"""A micro-batch's forward, loss and backward as CUDA graphs, one per batch shape, replayed instead of launched.

A training step launches about a thousand kernels, most of them short, and launched one by one from
Python the GPU waits for the host between them. A graph records the kernels once; a replay runs them
all from one call. A replay reuses every address of its capture, so the batch is copied into
tensors kept for its shape, gradients accumulate into ``.grad`` tensors that exist before the capture
(the optimizer's ``zero_grad`` must keep them), and the loss's divisor (the update's target tokens)
is a device tensor filled before each replay. Dropout stays random: PyTorch advances a captured
graph's random offsets on every replay. The graphs share one memory pool, which is safe because they
never run at once and each replay's outputs are read before the next replay is queued.

A shape is run eagerly the first time it is seen (that warms up the libraries and, under
``train.compile``, compiles it), captured the second time, and replayed from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.text.batching import Batch

MicroStep = Callable[[Batch, Tensor], tuple[Tensor, Tensor]]
"""Runs forward, loss and backward of the loss divided by a divisor tensor; returns that loss and the nll sum."""


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    batch: Batch  # the tensors the graph reads its batch from
    divisor: Tensor  # what the loss is divided by before backward
    loss: Tensor  # the graph's outputs
    nll: Tensor


class MicroStepGraphs:
    """Calls ``step(batch, divisor)``: eagerly for a shape seen once, through its CUDA graph after that."""

    def __init__(self, step: MicroStep, device: torch.device) -> None:
        self.step = step
        self.device = device
        self.seen: set[tuple[torch.Size, ...]] = set()
        self.captured: dict[tuple[torch.Size, ...], _Captured] = {}
        self.pool: tuple[int, int] | None = None

    def __len__(self) -> int:
        """How many shapes have a graph."""
        return len(self.captured)

    def __call__(self, batch: Batch, divisor: float) -> tuple[Tensor, Tensor]:
        """``batch``'s loss over ``divisor`` and its nll sum; the loss's gradients are added to the ``.grad``s."""
        key = (batch.src.shape, batch.tgt_in.shape, batch.tgt_out.shape)
        if key not in self.captured and key not in self.seen:
            self.seen.add(key)
            return self.step(batch, torch.full((), divisor, device=self.device))
        if key not in self.captured:
            self.captured[key] = self._capture(batch)
        c = self.captured[key]
        for static, new in zip(
            (c.batch.src, c.batch.tgt_in, c.batch.tgt_out), (batch.src, batch.tgt_in, batch.tgt_out)
        ):
            static.copy_(new, non_blocking=True)
        c.divisor.fill_(divisor)
        c.graph.replay()
        return c.loss.clone(), c.nll.clone()

    def _capture(self, batch: Batch) -> _Captured:
        """Record ``step`` on tensors of ``batch``'s shape, kept outside the graph's pool; nothing runs yet."""
        static = Batch(batch.src.clone(), batch.tgt_in.clone(), batch.tgt_out.clone(), batch.n_tokens)
        divisor = torch.ones((), device=self.device)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the prefetch thread may pin host memory meanwhile, which a global capture would forbid
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            loss, nll = self.step(static, divisor)
        self.pool = self.pool or graph.pool()
        return _Captured(graph, static, divisor, loss, nll)
