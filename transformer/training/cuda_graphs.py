"""A micro-batch's forward, loss and backward as CUDA graphs, one per batch shape, replayed instead of launched; the
update's tail (clipping, the finite check, Adam's step, zeroing) as one more.

A training step launches about a thousand kernels, most of them short, and launched one by one from
Python the GPU waits for the host between them. A graph records the kernels once; a replay runs them
all from one call. A replay reuses every address of its capture, so the batch is copied into
tensors kept for its shape, gradients accumulate into ``.grad`` tensors that exist before the capture
(the optimizer's ``zero_grad`` must keep them), and the loss's divisor (the update's target tokens)
is a device tensor filled before each replay. Dropout stays random: PyTorch advances a captured
graph's random offsets on every replay. The graphs share one memory pool, which is safe because they
never run at once and each replay's outputs are read before the next replay is queued.

A shape is run eagerly the first time it is seen (that warms up the libraries and, under
``train.compile``, compiles it), captured the second time, and replayed from then on. The tail has
one shape: it runs eagerly once (Adam makes its state then), is captured the second time, and then
replayed; Adam's rate and step count live on the device for it (a rate tensor, ``capturable``).
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


class TailGraph:
    """Calls ``tail()``: eagerly the first time, through its CUDA graph after that.

    ``tail`` takes no arguments: it reads tensors kept in place (filled before each call) and returns one tensor,
    which each replay overwrites (read it, or queue its copy, before the next call). Its graph has a memory pool of
    its own: the tail works in place on the gradients and Adam's state, so the pool stays small.
    """

    def __init__(self, tail: Callable[[], Tensor], device: torch.device) -> None:
        self.tail = tail
        self.device = device
        self.ran = False
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Tensor | None = None

    def __call__(self) -> Tensor:
        if not self.ran:
            self.ran = True
            return self.tail()
        if self.graph is None:
            torch.cuda.synchronize(self.device)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.out = self.tail()
        self.graph.replay()
        return self.out
