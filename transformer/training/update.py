"""One optimizer update: micro-batches accumulated, gradients clipped, the schedule's rate, a non-finite update skipped.

The loss is label-smoothed cross-entropy summed over the update's micro-batches and divided by the
whole update's non-pad target tokens (every rank's, under torchrun), so the gradient does not depend
on how the tokens were split into batches or across processes.

Two switches change how the micro-batches run on a GPU, not what they compute: ``train.compile``
(torch.compile of each encoder and decoder layer, ``compile_layers``) and ``train.cuda_graphs`` (each batch
shape's forward, loss and backward replayed as a CUDA graph, transformer.training.cuda_graphs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, NamedTuple

import torch

from transformer.config import Config
from transformer.device import autocast
from transformer.model.speed import training_attention
from transformer.model.transformer import Transformer
from transformer.text.batching import Batch, EncodedCorpus, collate
from transformer.text.tokenizer import Tokenizer
from transformer.training import distributed
from transformer.training.cuda_graphs import MicroStepGraphs
from transformer.training.loss import generator_loss
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


def collate_update(
    micro: list[list[int]], data: EncodedCorpus, tokenizer: Tokenizer, cfg: Config, pin: bool = False
) -> UpdateBatches:
    """This rank's micro-batches of one update's index lists, collated (and pinned, for an asynchronous copy)."""
    t = cfg.train
    static = t.batch_tokens if t.static_shapes else None
    batches = []
    for idx, weight in distributed.shard(micro):  # this rank's batches: all of them in a single process
        b = collate(data, idx, tokenizer, t.pad_multiple, static)
        batches.append((b.pin_memory() if pin else b, weight))
    return UpdateBatches(batches, distributed.target_tokens(data.tgt_lengths, micro))


class Updated(NamedTuple):
    """What a finite update reports: its loss and nll per target token, its target tokens (every rank's) and the
    gradient norm before clipping."""

    loss: float
    nll: float
    tokens: int
    grad_norm: float


class Updater:
    """Runs optimizer updates of ``model`` (through ``ddp``, its DistributedDataParallel wrapper or itself)."""

    def __init__(
        self,
        cfg: Config,
        device: torch.device,
        model: Transformer,
        ddp: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
    ) -> None:
        self.cfg, self.device = cfg, device
        self.model, self.ddp = model, ddp
        if cfg.train.compile:
            compile_layers(model)
        self.forward = ddp
        self.optimizer, self.scaler = optimizer, scaler
        self.graphs = MicroStepGraphs(self._graphed_step, device) if cfg.train.cuda_graphs else None

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
            )
        return loss_sum / total, nll_sum

    def _graphed_step(self, batch: Batch, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``micro_loss`` and the loss's backward, with the update's target tokens as a tensor (what a CUDA graph
        may replay)."""
        loss, nll = self.micro_loss(batch, total)
        loss.backward()
        return loss.detach(), nll.detach()

    def __call__(self, work: UpdateBatches, step: int) -> Updated | None:
        """Update ``step`` (from 1) over one update's batches; None if it was skipped (non-finite)."""
        world, total = distributed.world_size(), work.total
        sums = torch.zeros(2, device=self.device)  # this rank's share of the update's loss and nll
        for k, (b, weight) in enumerate(work.batches):
            b = b.to(self.device, non_blocking=self.device.type == "cuda")
            if self.graphs is not None:  # one process, bf16 or fp32: no DDP sync, no loss scale, weight 1
                loss, nll = self.graphs(b, float(total))
            else:
                with distributed.sync_unless(self.ddp, skip=k < len(work.batches) - 1):
                    loss, nll = self.micro_loss(b, total)
                    # DDP averages gradients over ranks: x world makes it their sum. A filler batch weighs 0.
                    self.scaler.scale(loss * (weight * world)).backward()
            sums += torch.stack([loss.detach(), nll.detach()]) * weight
        loss_total, nll_total = distributed.all_sum(sums)
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.train.clip_norm if self.cfg.train.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        lr = learning_rate(step, self.cfg.train, self.cfg.model.d_model)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # The update's one host sync, a copy of four numbers: skipping a non-finite update and counting
        # bad ones need the verdict on the host, and the logged values come along, so nothing else waits.
        ok = torch.isfinite(grad_norm) & torch.isfinite(loss_total)
        host = torch.stack([loss_total.float(), nll_total.float(), grad_norm.float(), ok.float()]).tolist()
        loss_value, nll_value, norm_value, finite = host
        if finite:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        # CUDA graphs add into the .grad tensors they captured: those must stay, zeroed.
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        if not finite:
            return None
        return Updated(loss_value, nll_value / total, total, norm_value)
