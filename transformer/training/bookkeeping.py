"""The books of a training run: each update counted when queued and booked once the device has done it (its
verdict, tokens and log record), the progress bar, the clock, the forecast and the log records of the run.

An update is booked once the next one is queued, so the device works on one while the host books the other
(transformer.training.update.Queued); the loop books at once before validating, saving or stopping.
"""

from __future__ import annotations

import math
import sys
from typing import Callable

import torch
from tqdm import tqdm

from transformer.training import mfu
from transformer.training.forecast import forecast
from transformer.training.meter import Meter, clock
from transformer.training.run_log import RunLog
from transformer.training.schedule import learning_rate
from transformer.training.setup import Run
from transformer.training.update import Queued, Updated


class Books:
    """The books of ``run`` from where its state stands; records go to ``run_log``, messages to ``log``."""

    def __init__(self, run: Run, run_log: RunLog, started: float, quiet: bool, log: Callable[[str], None]) -> None:
        self.run, self.state, self.run_log, self.log = run, run.state, run_log, log
        self.started, self.set_up_s = started, clock() - started
        self.meter = Meter(run.state)
        self.bar = tqdm(
            total=run.cfg.train.max_steps,
            initial=run.state.step,
            disable=quiet,
            file=sys.stderr,
            dynamic_ncols=True,
            unit="step",
        )
        self.queued: Queued | None = None
        self.peak = mfu.bf16_peak(run.device)

    def count(self, queued: Queued, batch_in_epoch: int) -> None:
        """Count a queued update: where the data stands, the step, the clock. It is booked later (``book``)."""
        self.state.batch_in_epoch = batch_in_epoch
        self.state.step += 1
        self.queued = queued
        self.meter.tick()
        self.bar.update(1)
        self._forecast()

    def book(self) -> bool:
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
        if out is not None and s.step % self.run.cfg.train.log_every == 0:
            self._log(out)
        return s.bad_in_a_row >= self.run.cfg.train.max_bad_steps

    def drawn(self, epoch: int, pairs: dict[str, int]) -> None:
        """What an epoch of several directions (or of synthetic pairs beside real ones) draws of each."""
        self.run_log.record({"step": self.state.step, "kind": "epoch", "epoch": epoch, "drawn": pairs})
        self.log(f"epoch {epoch + 1}: " + ", ".join(f"{name} {n:,} pairs" for name, n in pairs.items()))

    def stopped_non_finite(self, scaler: torch.amp.GradScaler) -> None:
        """Say why training stopped after ``train.max_bad_steps`` non-finite updates, and what to change."""
        s, cfg = self.state, self.run.cfg
        lr = learning_rate(s.step, cfg.train, cfg.model.d_model)
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        self.log(
            f"stopped: {cfg.train.max_bad_steps} updates in a row with non-finite loss or gradients at step {s.step} "
            f"(last finite loss {s.last_finite_loss:.4f}, lr {lr:.2e}, loss scale {scale}); lower train.peak_lr or "
            "train.lr_factor, or use precision: bf16 or fp32. Checkpoints before this point are intact."
        )

    def close(self) -> None:
        """Close the progress bar."""
        self.bar.close()

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
        lr = learning_rate(self.state.step, self.run.cfg.train, self.run.cfg.model.d_model)
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
        t = self.run.cfg.train
        per_update = self.meter.seconds_per_update()
        if per_update is not None and t.max_minutes is None:
            if note := forecast(per_update, t.max_steps - self.state.step, self.run.device.type):
                self.log(note)

    def time_split(self, reason: str) -> None:
        """Where the run's time went, so that a user sees whether validation or checkpoints eat the budget."""
        s, split = self.state, self.meter.split()
        total = split["seconds"]
        self.run_log.record({"step": s.step, "kind": "end", "reason": reason, **split})
        share = [
            f"{name} {split[key] / 60:.1f} min ({100 * split[key] / max(total, 1e-9):.0f}%)"
            for name, key in (("training", "train_s"), ("validation", "valid_s"), ("checkpoints", "save_s"))
        ]
        self.log(f"time: {total / 60:.1f} min: {', '.join(share)}")
