"""The training loop: update after update, epoch after epoch, until a stopping rule says enough.

One optimizer update (transformer.training.update) = ``train.accumulate`` token-sized micro-batches, the loss
normalised by the update's non-pad target tokens. Validation (transformer.training.validation) runs every
``eval_every`` updates; the best BLEU is kept in ``<run>/best``, the last ``keep_last`` resumable checkpoints in
``<run>/checkpoints/step_N``. What the run needs is prepared before the loop (transformer.training.setup); its books
(counting, booking and logging each update) are transformer.training.bookkeeping's. SIGINT or SIGTERM finishes the
current update, saves a resumable checkpoint and stops (transformer.training.signals).

Under torchrun each of W processes runs ``accumulate`` of an update's ``accumulate x W`` batches
(DistributedDataParallel, see transformer.training.distributed); rank 0 alone logs, validates and saves.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from transformer import checkpoint
from transformer.config import Config
from transformer.text.batching import make_batches
from transformer.text.directions import counts, drawn
from transformer.training import distributed, run_dir, setup, tensorboard_log, train_state
from transformer.training.bookkeeping import Books
from transformer.training.meter import process_started
from transformer.training.prefetch import ahead
from transformer.training.run_log import open_run_log
from transformer.training.signals import StopSignals
from transformer.training.train_state import TrainState
from transformer.training.update import UpdateBatches, collate_update
from transformer.training.validation import Validator


@dataclass
class Result:
    """How a training run ended."""

    state: TrainState
    reason: str
    exit_code: int = 0
    run_dir: Path = field(default_factory=Path)


class Trainer:
    """Trains the model a Config describes, into ``cfg.out_dir``; what cannot run is refused before anything is
    written (``setup.placed``)."""

    def __init__(
        self,
        cfg: Config,
        resume: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        main = distributed.launched_rank() == 0  # under torchrun the other ranks say nothing
        self.started = process_started()
        self.options = resume, overwrite, quiet or not main
        self.log = (log or (lambda msg: print(msg, file=sys.stderr))) if main else (lambda msg: None)
        self.tensorboard = tensorboard_log.wanted(cfg.train.tensorboard)
        self.cfg, self.device = setup.placed(cfg, resume, self.log)

    def run(self) -> Result:
        """Train until max_steps, max_epochs, max_minutes, early stopping or a signal; always leave a checkpoint.

        Under torchrun every process runs this; they train one model together (see transformer.training.distributed).
        """
        distributed.init(self.device)
        try:
            if distributed.is_main() and (note := distributed.unused_gpus_note(self.device)):
                self.log(note)
            # from the start: Ctrl-C during set-up is no traceback; rank 0 holds the run directory for the run
            hold = run_dir.locked(self.cfg.out_dir) if distributed.is_main() else contextlib.nullcontext()
            with StopSignals(self.log) as signals, hold:
                return self._prepared_and_trained(signals)
        finally:  # the run, its DDP wrapper among it, was dropped with the call above: the process group may go
            distributed.close()

    def _prepared_and_trained(self, signals: StopSignals) -> Result:
        resume, overwrite, quiet = self.options
        run = setup.prepare(self.cfg, self.device, resume, overwrite, self.log)
        if signals.signum is not None:  # a signal before the first update: nothing new to save
            self.log(f"interrupted before the first update; nothing saved beyond what {run.out_dir} held")
            return Result(run.state, "signal", signals.exit_code(), run.out_dir)
        if run.state.step >= run.cfg.train.max_steps:  # a resumed run that has nothing left to do
            self.log(
                f"already at max_steps ({run.cfg.train.max_steps}); nothing to do (raise train.max_steps to go on)"
            )
            return Result(run.state, "finished", 0, run.out_dir)
        n_params = sum(p.numel() for p in run.model.parameters())
        self.log(f"model: {n_params:,} parameters on {run.device} in {run.cfg.precision}")
        if self.tensorboard:
            events = run.out_dir / tensorboard_log.FOLDER
            self.log(f"TensorBoard events in {events} (to see them: tensorboard --logdir {run.cfg.run_dir})")
        with open_run_log(run.out_dir, self.tensorboard, run.state.step + 1, run.config_yaml) as run_log:
            books = Books(run, run_log, self.started, quiet, self.log)
            return Loop(run, books, signals, self.log).train()


class Loop:
    """The paper's training procedure over a prepared ``run``: update, book, validate, save, stop."""

    def __init__(self, run: setup.Run, books: Books, signals: StopSignals, log: Callable[[str], None]) -> None:
        self.run, self.state, self.books, self.signals, self.log = run, run.state, books, signals, log
        self.validate = (
            Validator(run.model, run.tokenizer, run.cfg, run.device, run.data.valid) if distributed.is_main() else None
        )

    def train(self) -> Result:
        """Train, then finish: the progress bar is closed whatever happens."""
        self.run.model.train()
        self.signals.training = True
        try:
            reason = self._epochs()
        finally:
            self.books.close()
        return self._finish(reason)

    def _epochs(self) -> str:
        """Epoch after epoch, update after update: update, book, validate, save, stop; why training stopped.

        Each update is booked once the next one is queued (bookkeeping.Books); the first update, and one before
        validating, saving or stopping, is booked at once.
        """
        t, books = self.run.cfg.train, self.books
        while self.state.epoch < t.max_epochs:
            with contextlib.closing(self._updates()) as updates:
                for batch_in_epoch, work in updates:
                    queued = self.run.update(work, self.state.step + 1)
                    if books.book():  # the update before ended a bad run: the device skips the one just queued
                        return "non_finite"
                    books.count(queued, batch_in_epoch)
                    step = self.state.step
                    evaluate, save = step % t.eval_every == 0, step % t.save_every == 0
                    if (evaluate or save or step == books.meter.first_step) and books.book():
                        return "non_finite"
                    early_stop = False
                    if evaluate:
                        self._evaluate_and_keep_best()
                        early_stop = self.state.evals_without_gain >= t.patience
                    if save:
                        self._save("periodic")
                    if reason := self._limit_reached() or ("early_stopping" if early_stop else None):
                        return "non_finite" if books.book() else reason
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
        return "non_finite" if books.book() else "max_epochs"

    def _updates(self) -> Iterator[tuple[int, UpdateBatches]]:
        """The rest of the current epoch's updates, collated (ahead, with ``train.prefetch``), each with the
        position in the epoch after it."""
        cfg, t, data, epoch = self.run.cfg, self.run.cfg.train, self.run.data.train, self.state.epoch
        pairs = None if data.directions is None else drawn(data.directions, cfg.data.temperature, cfg.seed, epoch)
        if data.directions is not None and self.state.batch_in_epoch == 0:
            self.books.drawn(self.state.epoch, counts(data.directions, pairs, self.run.data.parts))
        batches = make_batches(data, t.batch_tokens, cfg.seed, epoch, True, t.pad_multiple, pairs)
        size = t.accumulate * distributed.world_size()  # the update's batches, all ranks'
        pin = self.run.device.type == "cuda"

        def collated(i: int) -> tuple[int, UpdateBatches]:
            work = collate_update(batches[i : i + size], data, self.run.tokenizer, cfg, pin)
            return min(i + size, len(batches)), work

        yield from ahead(collated, range(self.state.batch_in_epoch, len(batches), size), t.prefetch)

    def _limit_reached(self) -> str | None:
        """A signal, max_steps or max_minutes, whichever came first, agreed by every rank; it outranks early stopping.

        Ranks stop together: each takes the latest signal and the longest elapsed time any rank has seen.
        """
        t = self.run.cfg.train
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

    def _evaluate_and_keep_best(self) -> None:
        """Rank 0 validates and keeps the best; every rank then holds its verdict (for early stopping)."""
        if self.validate is not None:
            self._validate_and_keep_best(self.validate)
        verdict = distributed.from_main((self.state.best_bleu, self.state.evals_without_gain))
        self.state.best_bleu, self.state.evals_without_gain = verdict

    def _validate_and_keep_best(self, validate: Validator) -> None:
        run, s, meter = self.run, self.state, self.books.meter
        before = s.valid_s
        with meter.aside("valid"), run.update.eager():
            metrics = validate()
        since = meter.since_start()
        self.books.run_log.record(
            {"step": s.step, "kind": "valid", **metrics, "valid_s": s.valid_s - before, "elapsed_s": since}
        )
        if metrics["valid_bleu"] > s.best_bleu:
            s.best_bleu, s.evals_without_gain = metrics["valid_bleu"], 0
            with meter.aside("save"):
                checkpoint.save(run.out_dir / "best", run.cfg, run.tokenizer, run.model, {"step": s.step, **metrics})
        else:
            s.evals_without_gain += 1
        self.log(
            f"step {s.step}: valid loss {metrics['valid_loss']:.3f} ppl {metrics['valid_ppl']:.2f} "
            f"BLEU {metrics['valid_bleu']:.2f} (best {s.best_bleu:.2f})"
        )

    def _save(self, reason: str) -> None:
        """A resumable checkpoint, written by rank 0 with every rank's RNG state; the other ranks wait."""
        run, s = self.run, self.state
        with self.books.meter.aside("save"):
            s.elapsed = self.books.meter.since_start()  # with the validation just before: a resumed run goes on here
            rank_rng = distributed.gather_rng(run.device)
            if distributed.is_main():
                meta = {"step": s.step, "best_bleu": s.best_bleu, "reason": reason}
                path = run.out_dir / "checkpoints" / f"{checkpoint.STEP_PREFIX}{s.step}"
                state = train_state.capture(s, run.update.optimizer, run.update.scaler)
                state |= {"rank_rng": rank_rng} if rank_rng else {}
                checkpoint.save(path, run.cfg, run.tokenizer, run.model, meta, state)
                checkpoint.prune(run.out_dir, run.cfg.train.keep_last)
            distributed.barrier()

    def _finish(self, reason: str) -> Result:
        """Validate and save as the reason calls for, and say how the run ended."""
        run, s, code = self.run, self.state, 0
        if reason == "non_finite":
            self.books.stopped_non_finite(run.update.scaler)
            code = 1
        elif reason == "signal":
            code = self.signals.exit_code()
        elif s.step % run.cfg.train.eval_every != 0:  # else the loop validated this very step
            self._evaluate_and_keep_best()
        if reason != "non_finite":
            self._save(reason)
        self.log(
            f"{reason}: step {s.step}, best valid BLEU {s.best_bleu:.2f}, "
            f"{s.skipped_steps} skipped updates; checkpoints in {run.out_dir}"
        )
        self.books.time_split(reason)
        return Result(s, reason, code, run.out_dir)
