"""The training loop: update after update, epoch after epoch, until a stopping rule says enough.

One optimizer update (transformer.training.update) = ``train.accumulate`` token-sized micro-batches, the
loss normalised by the update's non-pad target tokens. Validation (transformer.training.validation) runs
every ``eval_every`` updates; the best BLEU is kept in ``<run>/best``, the last ``keep_last``
resumable checkpoints in ``<run>/checkpoints/step_N``. Log records go to ``log.jsonl`` and, when on, TensorBoard
(transformer.training.run_log). SIGINT or SIGTERM finishes the current
update, saves a resumable checkpoint and stops (transformer.training.signals). Preparing or resuming the run
directory is transformer.training.run_dir's; what a checkpoint holds of the trainer, transformer.training.train_state's.

Under torchrun each of W processes runs ``accumulate`` of an update's ``accumulate x W`` batches
(DistributedDataParallel, see transformer.training.distributed); rank 0 alone logs, validates and saves.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from transformer import checkpoint
from transformer.config import Config
from transformer.config_file import dump
from transformer.device import check_gpu_switches, resolve_device
from transformer.errors import ConfigError
from transformer.memory import check_fits
from transformer.model.transformer import build_model
from transformer.precision import PRECISIONS, check_precision, measured_training, training_precision
from transformer.text.batching import make_batches
from transformer.text.tokenizer import Tokenizer
from transformer.training import distributed, mfu, run_dir, tensorboard_log, train_data, train_state
from transformer.training.forecast import forecast
from transformer.training.meter import Meter, clock, process_started
from transformer.training.prefetch import ahead
from transformer.training.run_log import open_run_log
from transformer.training.schedule import learning_rate, make_optimizer
from transformer.training.signals import StopSignals
from transformer.training.train_state import TrainState
from transformer.training.update import Queued, UpdateBatches, Updated, Updater, collate_update
from transformer.training.validation import valid_metrics


@dataclass
class Result:
    """How a training run ended."""

    state: TrainState
    reason: str
    exit_code: int = 0
    run_dir: Path = field(default_factory=Path)


class Trainer:
    """Trains the model a Config describes, into ``cfg.out_dir``."""

    def __init__(
        self,
        cfg: Config,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.resume = resume
        self.overwrite = overwrite
        main = distributed.launched_rank() == 0  # under torchrun the other ranks say nothing
        self.quiet = quiet or not main
        self.log = (log or (lambda msg: print(msg, file=sys.stderr))) if main else (lambda msg: None)
        self.started = process_started()
        self.run_dir = cfg.out_dir
        self.device = distributed.local_device(resolve_device(cfg.device))
        check_fits(cfg.model, cfg.tokenizer.vocab_size, self.device, True, "the config's model")  # before any work
        # precision: auto becomes what this device runs best, and the run's config.yaml records it; a CPU without
        # AMX is measured, by one process only (ranks under torchrun keep fp32 rather than each choose its own)
        check_precision(cfg.precision, self.device, training=True)
        alone = distributed.launched_world() == 1
        measured = (lambda: measured_training(cfg.model, cfg.tokenizer.vocab_size, self.log)) if alone else None
        self.cfg = replace(cfg, precision=training_precision(cfg.precision, self.device, measured))
        check_gpu_switches(self.cfg.train, self.cfg.precision, self.device)
        self.tensorboard = tensorboard_log.wanted(cfg.train.tensorboard)

    def run(self) -> Result:
        """Train until max_steps, max_epochs, max_minutes, early stopping or a signal; always leave a checkpoint.

        Under torchrun every process runs this; they train one model together (see transformer.training.distributed).
        """
        distributed.init(self.device)
        try:
            if self.cfg.train.cuda_graphs and distributed.world_size() > 1:
                raise ConfigError(
                    "train.cuda_graphs: true runs in one process only, not under torchrun; set train.cuda_graphs: false"
                )
            if distributed.is_main() and (note := distributed.unused_gpus_note(self.device)):
                self.log(note)
            # from the start: Ctrl-C during set-up is no traceback; rank 0 holds the run directory for the run
            hold = run_dir.locked(self.run_dir) if distributed.is_main() else contextlib.nullcontext()
            with StopSignals(self.log) as self.signals, hold:
                return self._run()
        finally:
            vars(self).pop("update", None)  # its DDP wrapper holds the process group: free it before the group goes
            distributed.close()

    # ----- set-up -------------------------------------------------------------------------------------------

    def _run(self) -> Result:
        cfg, t = self.cfg, self.cfg.train
        resume_from = None
        if distributed.is_main():
            resume_from = run_dir.prepare(self.run_dir, self.resume, self.overwrite, self.log)
        resume_from = distributed.from_main(resume_from)  # every rank resumes from rank 0's choice
        tokenizer = None
        if resume_from is not None:
            run_dir.check_compatible(cfg, resume_from)
            tokenizer = Tokenizer.load(resume_from / checkpoint.TOKENIZER)
        torch.manual_seed(cfg.seed)
        with distributed.main_first():  # rank 0 trains and saves the tokenizer; the others read it
            if tokenizer is None and not distributed.is_main():
                tokenizer = Tokenizer.load(self.run_dir / checkpoint.TOKENIZER)
            data = train_data.read_splits(cfg, self.run_dir, tokenizer, self.log)
            self.tokenizer, self.train_enc, self.valid, self.valid_enc = data
        if self.signals.signum is not None:
            return self._stopped_in_set_up(TrainState())
        self.model = build_model(cfg.model, self.tokenizer.vocab_size, self.tokenizer.pad_id).to(self.device)
        ddp = distributed.wrap(self.model, self.device)
        distributed.seed_dropout(cfg.seed)
        self.optimizer = make_optimizer(self.model, t, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=PRECISIONS[cfg.precision].loss_scaling)
        self.update = Updater(cfg, self.device, self.model, ddp, self.optimizer, self.scaler)
        config_yaml = dump(cfg)
        if distributed.is_main():
            run_dir.write_file(self.run_dir, checkpoint.CONFIG, config_yaml)
        self.state = self._restored(resume_from) if resume_from is not None else TrainState()
        if self.state.step >= t.max_steps:  # a resumed run that has nothing left to do
            self.log(f"already at max_steps ({t.max_steps}); nothing to do (raise train.max_steps to go on)")
            return Result(self.state, "finished", 0, self.run_dir)
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"model: {n_params:,} parameters on {self.device} in {cfg.precision}")
        if self.signals.signum is not None:
            return self._stopped_in_set_up(self.state)
        if self.tensorboard:
            events = self.run_dir / tensorboard_log.FOLDER
            self.log(f"TensorBoard events in {events} (to see them: tensorboard --logdir {cfg.run_dir})")
        with open_run_log(self.run_dir, self.tensorboard, self.state.step + 1, config_yaml) as self.run_log:
            return self._loop()

    def _stopped_in_set_up(self, state: TrainState) -> Result:
        """A signal before the first update: nothing new to save; a plain rerun starts afresh (run_dir.prepare)."""
        self.log(f"interrupted before the first update; nothing saved beyond what {self.run_dir} held")
        return Result(state, "signal", self.signals.exit_code(), self.run_dir)

    def _restored(self, ckpt_dir: Path) -> TrainState:
        """Weights, optimizer, scaler and RNGs put back as ``ckpt_dir`` saved them; its TrainState."""
        self.model.load_state_dict(checkpoint.load(ckpt_dir, self.device).model.state_dict())
        saved = checkpoint.load_trainer_state(ckpt_dir)
        state = train_state.restore(saved, self.optimizer, self.scaler)
        self.update.resume(state.bad_in_a_row)
        distributed.restore_rng(saved.get("rank_rng"), self.device, self.cfg.seed, state.step, self.log)
        self.log(f"resumed from {ckpt_dir} at step {state.step}")
        return state

    # ----- the loop ------------------------------------------------------------------------------------------

    def _loop(self) -> Result:
        """Train, then finish: the progress bar is closed whatever happens."""
        self.bar = tqdm(
            total=self.cfg.train.max_steps,
            initial=self.state.step,
            disable=self.quiet,
            file=sys.stderr,
            dynamic_ncols=True,
            unit="step",
        )
        self.meter = Meter(self.state)
        self.queued: Queued | None = None
        self.peak = mfu.bf16_peak(self.device)
        self.set_up_s = clock() - self.started
        self.model.train()
        self.signals.training = True
        try:
            reason = self._train()
        finally:
            self.bar.close()
        return self._finish(reason)

    def _train(self) -> str:
        """Epoch after epoch, update after update: update, log, validate, save, stop; why training stopped.

        Each update is booked (its verdict, tokens and log record) once the next one is queued, so the device works
        on one while the host books the other. The first update, and one before validating, saving or stopping,
        is booked at once.
        """
        t = self.cfg.train
        while self.state.epoch < t.max_epochs:
            with contextlib.closing(self._updates()) as updates:
                for batch_in_epoch, work in updates:
                    queued = self.update(work, self.state.step + 1)
                    if self._book():  # the update before ended a bad run: the device skips the one just queued
                        return "non_finite"
                    self._count(queued, batch_in_epoch)
                    self._forecast()
                    step = self.state.step
                    evaluate, save = step % t.eval_every == 0, step % t.save_every == 0
                    if (evaluate or save or step == self.meter.first_step) and self._book():
                        return "non_finite"
                    early_stop = False
                    if evaluate:
                        self._evaluate_and_keep_best()
                        early_stop = self.state.evals_without_gain >= t.patience
                    if save:
                        self._save("periodic")
                    if reason := self._limit_reached() or ("early_stopping" if early_stop else None):
                        return "non_finite" if self._book() else reason
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
        return "non_finite" if self._book() else "max_epochs"

    def _updates(self) -> Iterator[tuple[int, UpdateBatches]]:
        """The rest of the current epoch's updates, collated (ahead, with ``train.prefetch``), each with the
        position in the epoch after it."""
        t = self.cfg.train
        batches = make_batches(
            self.train_enc, t.batch_tokens, self.cfg.seed, self.state.epoch, shuffle=True, pad_multiple=t.pad_multiple
        )
        size = t.accumulate * distributed.world_size()  # the update's batches, all ranks'
        pin = self.device.type == "cuda"

        def collated(i: int) -> tuple[int, UpdateBatches]:
            return min(i + size, len(batches)), collate_update(
                batches[i : i + size], self.train_enc, self.tokenizer, self.cfg, pin
            )

        yield from ahead(collated, range(self.state.batch_in_epoch, len(batches), size), t.prefetch)

    def _count(self, queued: Queued, batch_in_epoch: int) -> None:
        """Count a queued update: where the data stands, the step, the clock. It is booked later (``_book``)."""
        self.state.batch_in_epoch = batch_in_epoch
        self.state.step += 1
        self.queued = queued
        self.meter.tick()
        self.bar.update(1)

    def _book(self) -> bool:
        """Book the queued update, if there is one (waiting until the device has done it): a finite or a skipped
        update, its tokens, its log records. True when it made ``train.max_bad_steps`` non-finite updates in a row."""
        if self.queued is None:
            return False
        queued, self.queued = self.queued, None
        out = queued.result()
        s = self.state
        if out is None:
            s.skipped_steps += 1
            s.bad_in_a_row += 1
        else:
            s.bad_in_a_row = 0
            s.last_finite_loss = out.loss
            s.target_tokens += out.tokens
        self.meter.book(0 if out is None else out.tokens, queued.flops)
        if s.step == self.meter.first_step:
            self._log_start()
        if out is not None and s.step % self.cfg.train.log_every == 0:
            self._log(out)
        return s.bad_in_a_row >= self.cfg.train.max_bad_steps

    def _log_start(self) -> None:
        """How long the user waited for training to get under way: from the process's start to the end of its first
        update (the set-up before it: data, tokenizer, model; the first update itself: compilation, if on)."""
        first = clock() - self.started
        peak = {"peak_tflops": self.peak[0] / 1e12, "peak_source": self.peak[1]} if self.peak else {}
        self.run_log.record(
            {"step": self.state.step, "kind": "start", "first_update_s": first, "set_up_s": self.set_up_s, **peak}
        )
        self.log(f"first update done {first:.1f} s after the start ({self.set_up_s:.1f} s of set-up before it)")
        if self.peak:
            self.log(f"MFU: model FLOPs per second over {self.peak[0] / 1e12:,.0f} TFLOP/s ({self.peak[1]})")

    def _log(self, out: Updated) -> None:
        """A log record of the update, with the throughput of the updates since the last one (and on CUDA their
        model FLOPs per second over the card's bf16 peak, MFU)."""
        tps, flops = self.meter.throughput()
        lr = learning_rate(self.state.step, self.cfg.train, self.cfg.model.d_model)
        use = {"model_tflops_per_s": flops / 1e12, "mfu": flops / self.peak[0]} if self.peak else {}
        shown = {"mfu": f"{use['mfu']:.0%}"} if use else {}
        self.bar.set_postfix(loss=f"{out.loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", **shown)
        self.run_log.record(
            {
                "step": self.state.step,
                "kind": "train",
                "loss": out.loss,
                "nll": out.nll,
                "ppl": math.exp(min(out.nll, 50.0)),
                "lr": lr,
                "grad_norm": out.grad_norm,
                "target_tokens_per_s": tps,
                **use,
                "skipped_steps": self.state.skipped_steps,
                "elapsed_s": self.state.elapsed,
            }
        )

    def _forecast(self) -> None:
        """After the first few updates, say how long the rest would take, if that is long."""
        t = self.cfg.train
        per_update = self.meter.seconds_per_update()
        if per_update is not None and t.max_minutes is None:
            if note := forecast(per_update, t.max_steps - self.state.step, self.device.type):
                self.log(note)

    def _limit_reached(self) -> str | None:
        """A signal, max_steps or max_minutes, whichever came first, agreed by every rank; it outranks early stopping.

        Ranks stop together: each takes the latest signal and the longest elapsed time any rank has seen.
        """
        t = self.cfg.train
        signum, elapsed = distributed.all_max([self.signals.signum or 0, self.state.elapsed])
        self.signals.signum = int(signum) or None
        self.state.elapsed = elapsed
        if self.signals.signum is not None:
            return "signal"
        if self.state.step >= t.max_steps:
            return "max_steps"
        if t.max_minutes is not None and self.state.elapsed >= t.max_minutes * 60:
            return "max_minutes"
        return None

    # ----- records, validation, checkpoints ------------------------------------------------------------------

    def _evaluate_and_keep_best(self) -> None:
        """Rank 0 validates and keeps the best; every rank then holds its verdict (for early stopping)."""
        if distributed.is_main():
            self._validate_and_keep_best()
        verdict = distributed.from_main((self.state.best_bleu, self.state.evals_without_gain))
        self.state.best_bleu, self.state.evals_without_gain = verdict

    def _validate_and_keep_best(self) -> None:
        before = self.state.valid_s
        with self.meter.aside("valid"), self.update.eager():
            metrics = valid_metrics(self.model, self.tokenizer, self.cfg, self.device, self.valid, self.valid_enc)
        self.run_log.record(
            {
                "step": self.state.step,
                "kind": "valid",
                **metrics,
                "valid_s": self.state.valid_s - before,
                "elapsed_s": self.meter.since_start(),
            }
        )
        if metrics["valid_bleu"] > self.state.best_bleu:
            self.state.best_bleu = metrics["valid_bleu"]
            self.state.evals_without_gain = 0
            meta = {"step": self.state.step, **metrics}
            with self.meter.aside("save"):
                checkpoint.save(self.run_dir / "best", self.cfg, self.tokenizer, self.model, meta)
        else:
            self.state.evals_without_gain += 1
        self.log(
            f"step {self.state.step}: valid loss {metrics['valid_loss']:.3f} ppl {metrics['valid_ppl']:.2f} "
            f"BLEU {metrics['valid_bleu']:.2f} (best {self.state.best_bleu:.2f})"
        )

    def _save(self, reason: str) -> None:
        """A resumable checkpoint, written by rank 0 with every rank's RNG state; the other ranks wait."""
        with self.meter.aside("save"):
            self.state.elapsed = self.meter.since_start()  # with the validation just before: a resumed run goes on here
            rank_rng = distributed.gather_rng(self.device)
            if distributed.is_main():
                meta = {"step": self.state.step, "best_bleu": self.state.best_bleu, "reason": reason}
                path = self.run_dir / "checkpoints" / f"{checkpoint.STEP_PREFIX}{self.state.step}"
                state = train_state.capture(self.state, self.optimizer, self.scaler)
                state |= {"rank_rng": rank_rng} if rank_rng else {}
                checkpoint.save(path, self.cfg, self.tokenizer, self.model, meta, state)
                checkpoint.prune(self.run_dir, self.cfg.train.keep_last)
            distributed.barrier()

    def _finish(self, reason: str) -> Result:
        """Validate and save as the reason calls for, and say how the run ended."""
        code = 0
        if reason == "non_finite":
            lr = learning_rate(self.state.step, self.cfg.train, self.cfg.model.d_model)
            self.log(
                f"stopped: {self.cfg.train.max_bad_steps} updates in a row with non-finite loss or gradients at "
                f"step {self.state.step} (last finite loss {self.state.last_finite_loss:.4f}, lr {lr:.2e}, "
                f"loss scale {self.scaler.get_scale() if self.scaler.is_enabled() else 1.0}); lower train.peak_lr "
                "or train.lr_factor, or use precision: bf16 or fp32. Checkpoints before this point are intact."
            )
            code = 1
        elif reason == "signal":
            code = self.signals.exit_code()
        elif self.state.step % self.cfg.train.eval_every != 0:  # else the loop validated this very step
            self._evaluate_and_keep_best()
        if reason != "non_finite":
            self._save(reason)
        self.log(
            f"{reason}: step {self.state.step}, best valid BLEU {self.state.best_bleu:.2f}, "
            f"{self.state.skipped_steps} skipped updates; checkpoints in {self.run_dir}"
        )
        self._record_time_split(reason)
        return Result(self.state, reason, code, self.run_dir)

    def _record_time_split(self, reason: str) -> None:
        """Where the run's time went, so that a user sees whether validation or checkpoints eat the budget."""
        s, split = self.state, self.meter.split()
        total = split["seconds"]
        self.run_log.record({"step": s.step, "kind": "end", "reason": reason, **split})
        share = [
            f"{name} {split[key] / 60:.1f} min ({100 * split[key] / max(total, 1e-9):.0f}%)"
            for name, key in (("training", "train_s"), ("validation", "valid_s"), ("checkpoints", "save_s"))
        ]
        self.log(f"time: {total / 60:.1f} min: {', '.join(share)}")
