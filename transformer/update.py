"""One optimizer update: micro-batches accumulated, gradients clipped, the schedule's rate, a non-finite update skipped.

The loss is label-smoothed cross-entropy summed over the update's micro-batches and divided by the
whole update's non-pad target tokens (every rank's, under torchrun), so the gradient does not depend
on how the tokens were split into batches or across processes.
"""

from __future__ import annotations

import torch

from transformer import distributed
from transformer.batching import Batch, EncodedCorpus, collate
from transformer.config import Config
from transformer.device import autocast
from transformer.kernels import training_attention
from transformer.loss import generator_loss
from transformer.model import Transformer
from transformer.schedule import learning_rate
from transformer.tokenizer import Tokenizer


class Updater:
    """Runs optimizer updates of ``model`` (through ``ddp``, its DistributedDataParallel wrapper or itself)."""

    def __init__(self, cfg: Config, device: torch.device, model: Transformer, ddp: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, tokenizer: Tokenizer,
                 train_enc: EncodedCorpus) -> None:
        self.cfg, self.device = cfg, device
        self.model, self.ddp = model, ddp
        self.optimizer, self.scaler = optimizer, scaler
        self.tokenizer, self.train_enc = tokenizer, train_enc

    def micro_loss(self, batch: Batch, total_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch's loss divided by the update's target tokens, and its summed NLL."""
        with autocast(self.cfg.precision, self.device), training_attention(self.device, batch.longest):
            hidden = self.ddp(batch.src, batch.tgt_in, logits=False)
            loss_sum, nll_sum = generator_loss(hidden, self.model.generator.weight, batch.tgt_out,
                                               self.cfg.train.label_smoothing, self.tokenizer.pad_id)
        return loss_sum / total_tokens, nll_sum

    def __call__(self, micro: list[list[int]], step: int) -> tuple[float, float, int] | None:
        """Update ``step`` (from 1) over micro-batches; (loss, nll per token, target tokens), or None if skipped."""
        pin = self.device.type == "cuda"
        mine = distributed.shard(micro)  # this rank's batches: all of them in a single process
        batches = [collate(self.train_enc, idx, self.tokenizer, self.cfg.train.pad_multiple) for idx, _ in mine]
        total = distributed.target_tokens(self.train_enc.tgt_lengths, micro)  # the whole update's, on every rank
        world = distributed.world_size()
        sums = torch.zeros(2, device=self.device)  # this rank's share of the update's loss and nll
        for k, (b, (_, weight)) in enumerate(zip(batches, mine)):
            b = b.to(self.device, non_blocking=pin)
            with distributed.sync_unless(self.ddp, skip=k < len(batches) - 1):
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
        # The update's one host sync, a copy of three numbers: skipping a non-finite update and counting
        # bad ones need the verdict on the host, and the loss values come along, so nothing else waits.
        ok = torch.isfinite(grad_norm) & torch.isfinite(loss_total)
        loss_value, nll_value, finite = torch.stack([loss_total.float(), nll_total.float(), ok.float()]).tolist()
        if finite:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if not finite:
            return None
        return loss_value, nll_value / total, total
