"""One optimizer update: micro-batches accumulated, gradients clipped, the schedule's rate, a non-finite update skipped.

The loss is label-smoothed cross-entropy summed over the update's micro-batches and divided by the
whole update's non-pad target tokens (every rank's, under torchrun), so the gradient does not depend
on how the tokens were split into batches or across processes.

The whole update runs on the device, its tail too: the gradient norm and the clipping, the finite
check, Adam's step (which fused Adam skips on the device for a non-finite update, given its
``found_inf``) and zeroing the gradients. The host waits for nothing inside an update: it is handed a
``Queued`` update, whose figures it reads once the next update is queued, so the device never idles
between two. Because a verdict reaches the host one update late, the device itself skips every update
after ``train.max_bad_steps`` non-finite ones in a row: a run stopped for them keeps its weights.

Two switches change how the micro-batches run on a GPU, not what they compute: ``train.compile``
(torch.compile of each encoder and decoder layer, ``compile_layers``, and of the loss over the vocabulary,
one chunk of rows at a time) and ``train.cuda_graphs`` (each batch shape's forward, loss and backward
replayed as a CUDA graph, and the tail as one more, transformer.training.cuda_graphs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, NamedTuple

import torch

from transformer.config import Config
from transformer.model.speed import training_attention
from transformer.model.transformer import Transformer
from transformer.runtime.precision import autocast
from transformer.text.batching import Batch, EncodedCorpus, collate
from transformer.text.tokenizer import Tokenizer
from transformer.training import distributed
from transformer.training.cuda_graphs import MicroStepGraphs, TailGraph
from transformer.training.loss import chunk_loss, generator_loss
from transformer.training.mfu import train_flops
from transformer.training.schedule import learning_rate

COMPILE_BACKEND = "inductor"  # torch.compile's default; the CPU tests swap in "aot_eager", which compiles in seconds


def compile_layers(model: Transformer) -> None:
    """torch.compile each encoder and decoder layer in place (regional compilation).

    The N layers of a stack run the same code on weights of the same shapes, so the code compiled for the
    first serves all N: compiling costs about one layer of each kind, not the whole model. Shapes are
    symbolic from the first batch (dynamic=True), so a new batch shape reuses that code rather than
    compiling it again. The weights stay where they were: state_dict and checkpoints are unchanged.
    """
    for layer in (*model.encoder.layers, *model.decoder.layers):
        layer.compile(backend=COMPILE_BACKEND, dynamic=True)


@dataclass
class UpdateBatches:
    """One update's work for this process: its micro-batches (on the CPU) with their weights, and the whole
    update's non-pad target tokens (every rank's)."""

    batches: list[tuple[Batch, float]]
    total: int
    flops: float  # the model FLOPs of this process's batches (transformer.training.mfu)


def collate_update(
    micro: list[list[int]], data: EncodedCorpus, tokenizer: Tokenizer, cfg: Config, pin: bool = False
) -> UpdateBatches:
    """This rank's micro-batches of one update's index lists, collated (and pinned, for an asynchronous copy)."""
    t = cfg.train
    static = t.batch_tokens if t.static_shapes else None
    batches, flops = [], 0.0
    for idx, weight in distributed.shard(micro):  # this rank's batches: all of them in a single process
        b = collate(data, idx, tokenizer, t.pad_multiple, static)
        batches.append((b.pin_memory() if pin else b, weight))
        flops += train_flops(cfg.model, tokenizer.vocab_size, len(idx), b.src.size(1), b.tgt_in.size(1))
    return UpdateBatches(batches, distributed.target_tokens(data.tgt_lengths, micro), flops)


class Updated(NamedTuple):
    """What a finite update reports: its loss and nll per target token, its target tokens (every rank's) and the
    gradient norm before clipping."""

    loss: float
    nll: float
    tokens: int
    grad_norm: float


class Queued:
    """An update queued on the device. Its figures travel to the host behind it, and ``result`` waits for that
    update alone: asked once the next update is queued, it keeps the device busy meanwhile."""

    def __init__(self, figures: torch.Tensor, total: int, flops: float) -> None:
        self.total, self.flops = total, flops
        self.figures, self.done = figures, None
        if figures.is_cuda:  # into pinned memory, so that the copy waits on the device, not the host
            self.figures = torch.empty(figures.shape, pin_memory=True).copy_(figures, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()

    def result(self) -> Updated | None:
        """What the update reports (waits until the device has done it); None if it was skipped."""
        if self.done is not None:
            self.done.synchronize()
        loss, nll, grad_norm, applied = self.figures.tolist()
        return Updated(loss, nll / self.total, self.total, grad_norm) if applied else None


@dataclass(frozen=True)
class Levers:
    """How an update runs on a GPU beyond what the config switches: what tfm trains with by default, and what
    bench.gpu_step turns off one at a time to measure each."""

    compiled_layers: bool = True  # under train.compile, the encoder and decoder layers compiled (compile_layers)
    compiled_loss: bool = True  # under train.compile, the loss over the vocabulary compiled (loss.chunk_loss)
    tail_graph: bool = True  # under train.cuda_graphs, the update's tail replayed as a CUDA graph as well


class Updater:
    """Queues optimizer updates of ``model`` (through ``ddp``, its DistributedDataParallel wrapper or itself)."""

    def __init__(
        self,
        cfg: Config,
        device: torch.device,
        model: Transformer,
        ddp: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        levers: Levers = Levers(),
    ) -> None:
        self.cfg, self.device = cfg, device
        self.model, self.ddp = model, ddp
        if cfg.train.compile and levers.compiled_layers:
            compile_layers(model)
        self.forward = ddp
        compiled_loss = cfg.train.compile and levers.compiled_loss
        self.chunk = torch.compile(chunk_loss, backend=COMPILE_BACKEND, dynamic=True) if compiled_loss else chunk_loss
        self.optimizer, self.scaler = optimizer, scaler
        self.graphs = MicroStepGraphs(self._graphed_step, device) if cfg.train.cuda_graphs else None
        # fused Adam skips a step on the device; torch's per-tensor Adam only when the host tells it to
        self.skips_on_device = bool(optimizer.defaults.get("fused"))
        self.graphed_tail = self.graphs is not None and levers.tail_graph and self.skips_on_device
        self.tail = TailGraph(self._tail, device) if self.graphed_tail else self._tail
        self.sums = torch.zeros(2, device=device)  # the update's loss and nll, where the tail reads them
        self.lr = torch.zeros((), device=device)  # the schedule's rate, filled in before each tail
        self.bad_in_a_row = torch.zeros((), device=device)  # non-finite updates in a row, as the device counts them

    def resume(self, bad_in_a_row: int) -> None:
        """Go on from a checkpoint that counted ``bad_in_a_row`` non-finite updates in a row before it."""
        self.bad_in_a_row.fill_(bad_in_a_row)

    def eager(self) -> ContextManager:
        """Run the model as plain PyTorch inside this block (validation, decoding): their shapes and modes are not
        training's, and compiling them as well would cost more time than it saves."""
        return torch.compiler.set_stance("force_eager") if self.cfg.train.compile else contextlib.nullcontext()

    def micro_loss(self, batch: Batch, total: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch's loss divided by the update's target tokens, and its summed NLL."""
        with autocast(self.cfg.precision, self.device), training_attention(self.device, batch.longest):
            hidden = self.forward(batch.src, batch.tgt_in, logits=False)
            loss_sum, nll_sum = generator_loss(
                hidden,
                self.model.generator.weight,
                batch.tgt_out,
                self.cfg.train.label_smoothing,
                self.model.pad_id,
                self.chunk,
            )
        return loss_sum / total, nll_sum

    def _graphed_step(self, batch: Batch, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``micro_loss`` and the loss's backward, with the update's target tokens as a tensor (what a CUDA graph
        may replay)."""
        loss, nll = self.micro_loss(batch, total)
        loss.backward()
        return loss.detach(), nll.detach()

    def __call__(self, work: UpdateBatches, step: int) -> Queued:
        """Queue update ``step`` (from 1) over one update's batches."""
        world, total = distributed.world_size(), work.total
        self.sums.zero_()  # this rank's share of the update's loss and nll
        for k, (b, weight) in enumerate(work.batches):
            b = b.to(self.device, non_blocking=self.device.type == "cuda")
            if self.graphs is not None:  # one process, bf16 or fp32: no DDP sync, no loss scale, weight 1
                loss, nll = self.graphs(b, float(total))
            else:
                with distributed.sync_unless(self.ddp, skip=k < len(work.batches) - 1):
                    loss, nll = self.micro_loss(b, total)
                    # DDP averages gradients over ranks: x world makes it their sum. A filler batch weighs 0.
                    self.scaler.scale(loss * (weight * world)).backward()
            self.sums += torch.stack([loss.detach(), nll.detach()]) * weight
        self.sums.copy_(distributed.all_sum(self.sums))
        lr = learning_rate(step, self.cfg.train, self.cfg.model.d_model)
        if self.skips_on_device:
            self.lr.fill_(lr)
        capturing = self.graphed_tail and self.tail.ran  # the tail's second call is its capture
        for group in self.optimizer.param_groups:  # set every time: restoring a checkpoint replaces the groups
            group["lr"] = self.lr if self.skips_on_device else lr
            group["capturable"] = capturing  # Adam refuses a capture without it, and warns of it without one
        return Queued(self.tail(), total, work.flops)

    def _tail(self) -> torch.Tensor:
        """Unscale, clip, check, step and zero the gradients; [loss, nll, gradient norm before clipping, 1 if the
        step was taken or 0 if skipped]. Reads the update's sums and rate from ``self.sums`` and ``self.lr``."""
        t = self.cfg.train
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), t.clip_norm if t.clip_norm > 0 else float("inf")
        )
        bad = ~(torch.isfinite(grad_norm) & torch.isfinite(self.sums[0]))
        skip = bad | (self.bad_in_a_row >= t.max_bad_steps)
        self.bad_in_a_row.add_(1).mul_(skip)
        if self.skips_on_device:
            self.optimizer.found_inf = skip.float()  # read by fused Adam, as GradScaler hands it over
            self.optimizer.step()
            del self.optimizer.found_inf
        elif not skip.item():  # the one host wait, for an optimizer that cannot skip by itself
            self.scaler.step(self.optimizer)
        self.scaler.update()
        # CUDA graphs add into the .grad tensors they captured: those must stay, zeroed.
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        return torch.cat([self.sums, grad_norm.reshape(1).float(), (~skip).reshape(1).float()])
