"""The training loop: teacher-forced batches, Adam with the paper's schedule, checkpoints and validation.

One optimizer update = ``train.accumulate`` token-sized micro-batches, the loss
normalised by the update's non-pad target tokens. Validation (loss, perplexity,
greedy BLEU) runs every ``eval_every`` updates; the best BLEU is kept in
``<run>/best``, the last ``keep_last`` resumable checkpoints in
``<run>/checkpoints/step_N``. SIGINT or SIGTERM finishes the current update,
saves a resumable checkpoint and stops; a second signal stops at once.

Under torchrun each of W processes runs ``accumulate`` of an update's ``accumulate x W`` batches
(DistributedDataParallel, see transformer.distributed); rank 0 alone logs, validates and saves.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from transformer import checkpoint, distributed
from transformer.errors import CheckpointError, TrainError
from transformer.files import clean_partial
from transformer.batching import Batch, EncodedCorpus, collate, encode_corpus, make_batches
from transformer.config import Config, TrainConfig, dump, to_dict
from transformer.corpus import Corpus, load_split
from transformer.device import autocast, check_precision, resolve_device, resolve_precision
from transformer.evaluate import score
from transformer.kernels import fused_adam, training_attention
from transformer.loss import generator_loss, label_smoothed_nll
from transformer.model import build_model
from transformer.schedule import learning_rate
from transformer.tokenizer import Tokenizer, train_tokenizer
from transformer.translator import Translator

# Config sections that fix what a checkpoint's weights and tokenizer mean; resume refuses changes here.
FROZEN_SECTIONS = ("model", "tokenizer")


@dataclass
class TrainState:
    """Where training stands; saved in every resumable checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_bleu: float = -1.0
    evals_without_gain: int = 0
    skipped_steps: int = 0
    bad_in_a_row: int = 0
    last_finite_loss: float = float("nan")
    elapsed: float = 0.0
    target_tokens: int = 0


@dataclass
class Result:
    """How a training run ended."""

    state: TrainState
    reason: str
    exit_code: int = 0
    run_dir: Path = field(default_factory=Path)


def make_optimizer(model: torch.nn.Module, t: TrainConfig, device: torch.device, lr: float = 0.0,
                   fused: bool | None = None) -> torch.optim.Adam:
    """Adam with the config's betas, eps and weight decay (the schedule sets lr at every update).

    Fused (one kernel for all parameters) on CUDA, and on the CPU where torch has it, unless
    ``fused`` says otherwise (the benchmarks measure both).
    """
    fused = fused_adam(device) if fused is None else fused
    return torch.optim.Adam(model.parameters(), lr=lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay,
                            fused=fused or None)


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            keys.append(f"{prefix}{k} ({a!r} -> {b!r})")
    return keys


class Trainer:
    """Trains the model a Config describes, into ``cfg.out_dir``."""

    def __init__(self, cfg: Config, resume: bool = False, overwrite: bool = False, quiet: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        self.resume = resume
        self.overwrite = overwrite
        self.quiet = quiet
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.run_dir = cfg.out_dir
        self.device = distributed.local_device(resolve_device(cfg.device))
        # precision: auto becomes what this device runs best, and the run's config.yaml records it
        self.cfg = replace(cfg, precision=resolve_precision(cfg.precision, self.device))
        check_precision(self.cfg.precision, self.device)
        self.state = TrainState()
        self.stop_signal: int | None = None

    # ----- set-up -------------------------------------------------------------------------------------------

    def _prepare_run_dir(self) -> Path | None:
        """Check the run directory against --resume/--overwrite; return the checkpoint to resume from."""
        if self.resume:
            for folder in (self.run_dir, self.run_dir / "checkpoints"):  # what a kill -9 mid-save left behind
                for note in clean_partial(folder):
                    self.log(f"left by an interrupted save: {note}")
            existing = checkpoint.step_dirs(self.run_dir)
            if not existing:
                raise TrainError(f"--resume: no checkpoint in {self.run_dir}/checkpoints; start without --resume")
            return self._newest_intact(existing)
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            if not self.overwrite:
                raise TrainError(f"run directory {self.run_dir} already exists; pass --resume to continue it, "
                                 "--overwrite to start again, or --set name=<new name>")
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return None

    def _newest_intact(self, step_dirs: list[Path]) -> Path:
        """The newest checkpoint that loads whole; damaged newer ones are renamed ``damaged-step_N``, kept."""
        problems = []
        for path in reversed(step_dirs):
            try:
                checkpoint.load(path, "cpu")
                checkpoint.load_trainer_state(path)
            except CheckpointError as e:
                aside = path.with_name(f"damaged-{path.name}")
                path.rename(aside)
                self.log(f"{path.name} is damaged ({e}); moved to {aside} and resuming from an older checkpoint")
                problems.append(str(e))
                continue
            return path
        raise TrainError(f"--resume: every checkpoint in {self.run_dir}/checkpoints is damaged ({problems[0]}); "
                         "start without --resume, or restore one from a backup")

    def _load_data(self, tokenizer: Tokenizer | None) -> tuple[Tokenizer, EncodedCorpus, Corpus, EncodedCorpus]:
        d = self.cfg.data
        train = load_split(d, d.train_split)
        valid = load_split(d, d.valid_split)
        self.log(f"data: {len(train):,} training pairs ({train.dropped_empty} empty dropped), {len(valid):,} valid")
        if train.split_record is not None and distributed.is_main():  # data.holdout: which pairs were held out
            (self.run_dir / "split.json").write_text(json.dumps(train.split_record, indent=2) + "\n", encoding="utf-8")
        if tokenizer is None:
            tokenizer = train_tokenizer(self.cfg.tokenizer, train)
            tokenizer.save(self.run_dir / checkpoint.TOKENIZER)
            self.log(f"tokenizer: {tokenizer.vocab_size:,} BPE tokens, saved to {self.run_dir / checkpoint.TOKENIZER}")
        cache = Path(self.cfg.run_dir) / ".cache"
        train_enc = encode_corpus(train, tokenizer, d.max_len, cache)
        valid_enc = encode_corpus(valid, tokenizer, d.max_len, cache)
        if train_enc.dropped_long:
            self.log(f"data: {train_enc.dropped_long:,} training pairs longer than data.max_len={d.max_len} dropped")
        if len(train_enc) == 0:
            raise TrainError(f"no training pairs left after filtering {train.name}; check data.path and data.max_len")
        return tokenizer, train_enc, valid, valid_enc

    def _check_resume_compatible(self, ckpt_dir: Path) -> None:
        old = checkpoint.read_config(ckpt_dir)
        new_d, old_d = to_dict(self.cfg), to_dict(old)
        diffs = [k for s in FROZEN_SECTIONS for k in _differences({s: old_d[s]}, {s: new_d[s]})]
        diffs += [k for k in _differences(old_d["data"], new_d["data"]) if k.startswith(("src_lang", "tgt_lang"))]
        if diffs:
            raise TrainError(f"--resume refused: the config changed what the checkpoint means: {'; '.join(diffs)}; "
                             "restore these values or start a new run")

    # ----- the loop ------------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stop_signal is not None:
            self.log("second interrupt: stopping now; the last complete checkpoint is intact")
            raise SystemExit(128 + signum)
        self.stop_signal = signum
        self.log(f"{signal.Signals(signum).name}: finishing this update, then saving a resumable checkpoint "
                 "(interrupt again to stop at once)")

    def _agree_on_stop(self) -> None:
        """Ranks stop together: each takes the latest signal and the longest elapsed time any rank has seen."""
        signum, elapsed = distributed.all_max([self.stop_signal or 0, self.state.elapsed])
        self.stop_signal = int(signum) or None
        self.state.elapsed = elapsed

    def _micro_loss(self, batch: Batch, total_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.cfg.precision, self.device), training_attention(self.device, batch.longest):
            hidden = self.ddp(batch.src, batch.tgt_in, logits=False)
            loss_sum, nll_sum = generator_loss(hidden, self.model.generator.weight, batch.tgt_out,
                                               self.cfg.train.label_smoothing, self.tokenizer.pad_id)
        return loss_sum / total_tokens, nll_sum

    def _update(self, micro: list[list[int]]) -> tuple[float, float, int] | None:
        """One optimizer update over micro-batches; returns (loss, nll per token, target tokens) or None if skipped."""
        pin = self.device.type == "cuda"
        mine = distributed.shard(micro)  # this rank's batches: all of them in a single process
        batches = [collate(self.train_enc, idx, self.tokenizer, self.cfg.train.pad_multiple) for idx, _ in mine]
        total = distributed.target_tokens(self.train_enc.tgt_lengths, micro)  # the whole update's, on every rank
        world = distributed.world_size()
        sums = torch.zeros(2, device=self.device)  # this rank's share of the update's loss and nll
        for k, (b, (_, weight)) in enumerate(zip(batches, mine)):
            b = b.to(self.device, non_blocking=pin)
            with distributed.sync_unless(self.ddp, skip=k < len(batches) - 1):
                loss, nll = self._micro_loss(b, total)
                # DDP averages gradients over ranks: x world makes it their sum. A filler batch weighs 0.
                self.scaler.scale(loss * (weight * world)).backward()
            sums += torch.stack([loss.detach(), nll.detach()]) * weight
        loss_total, nll_total = distributed.all_sum(sums)
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.train.clip_norm if self.cfg.train.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        step = self.state.step + 1
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

    def _record(self, entry: dict[str, Any]) -> None:
        if not distributed.is_main():
            return
        with open(self.run_dir / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def validate(self) -> dict[str, float]:
        """Validation loss, perplexity and greedy BLEU on (a capped subset of) the valid split."""
        self.model.eval()
        loss_sum = nll_sum = 0.0
        tokens = 0
        with torch.inference_mode():
            for idx in make_batches(self.valid_enc, self.cfg.train.batch_tokens, self.cfg.seed, 0, shuffle=False):
                b = collate(self.valid_enc, idx, self.tokenizer).to(self.device)
                with autocast(self.cfg.precision, self.device), training_attention(self.device, b.longest):
                    logits = self.model(b.src, b.tgt_in)
                loss, nll = label_smoothed_nll(logits, b.tgt_out, self.cfg.train.label_smoothing, self.tokenizer.pad_id)
                loss_sum += float(loss)
                nll_sum += float(nll)
                tokens += b.n_tokens
        n = self.cfg.train.eval_sentences
        src, refs = list(self.valid.src[:n]), list(self.valid.tgt[:n])
        translator = Translator(self.model, self.tokenizer, self.cfg.decode, self.cfg.model.max_positions,
                                self.device, self.cfg.precision)
        hyps = [t.best for t in translator.translate(src, beam=1)]
        scores = score(hyps, refs, self.cfg.data.tgt_lang, self.cfg.decode.bleu_tokenize)
        self.model.train()
        nll = nll_sum / max(tokens, 1)
        return {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0)),
                "valid_bleu": scores.bleu, "valid_chrf": scores.chrf}

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "state": asdict(self.state),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def _save(self, reason: str) -> None:
        """A resumable checkpoint, written by rank 0 with every rank's RNG state; the other ranks wait."""
        rank_rng = distributed.gather_rng(self.device)
        if distributed.is_main():
            meta = {"step": self.state.step, "best_bleu": self.state.best_bleu, "reason": reason}
            path = self.run_dir / "checkpoints" / f"{checkpoint.STEP_PREFIX}{self.state.step}"
            state = self._trainer_state() | ({"rank_rng": rank_rng} if rank_rng else {})
            checkpoint.save(path, self.cfg, self.tokenizer, self.model, meta, state)
            checkpoint.prune(self.run_dir, self.cfg.train.keep_last)
        distributed.barrier()

    def _restore(self, ckpt_dir: Path) -> None:
        self.model.load_state_dict(checkpoint.load(ckpt_dir, self.device).model.state_dict())
        saved = checkpoint.load_trainer_state(ckpt_dir)
        self.state = TrainState(**saved["state"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scaler.load_state_dict(saved["scaler"])
        torch.set_rng_state(saved["cpu_rng"])
        if saved["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        distributed.restore_rng(saved.get("rank_rng"), self.device, self.cfg.seed, self.state.step, self.log)
        self.log(f"resumed from {ckpt_dir} at step {self.state.step}")

    def _evaluate_and_keep_best(self) -> None:
        """Rank 0 validates and keeps the best; every rank then holds its verdict (for early stopping)."""
        if distributed.is_main():
            self._validate_and_keep_best()
        verdict = distributed.from_main((self.state.best_bleu, self.state.evals_without_gain))
        self.state.best_bleu, self.state.evals_without_gain = verdict

    def _validate_and_keep_best(self) -> dict[str, float]:
        metrics = self.validate()
        self._record({"step": self.state.step, "kind": "valid", **metrics})
        if metrics["valid_bleu"] > self.state.best_bleu:
            self.state.best_bleu = metrics["valid_bleu"]
            self.state.evals_without_gain = 0
            meta = {"step": self.state.step, **metrics}
            checkpoint.save(self.run_dir / "best", self.cfg, self.tokenizer, self.model, meta)
        else:
            self.state.evals_without_gain += 1
        self.log(f"step {self.state.step}: valid loss {metrics['valid_loss']:.3f} ppl {metrics['valid_ppl']:.2f} "
                 f"BLEU {metrics['valid_bleu']:.2f} (best {self.state.best_bleu:.2f})")
        return metrics

    def run(self) -> Result:
        """Train until max_steps, max_epochs, max_minutes, early stopping or a signal; always leave a checkpoint.

        Under torchrun every process runs this; they train one model together (see transformer.distributed).
        """
        distributed.init(self.device)
        try:
            if not distributed.is_main():
                self.log, self.quiet = (lambda msg: None), True
            elif note := distributed.unused_gpus_note(self.device):
                self.log(note)
            return self._run()
        finally:
            distributed.close()

    def _run(self) -> Result:
        cfg, t = self.cfg, self.cfg.train
        resume_from = distributed.from_main(self._prepare_run_dir() if distributed.is_main() else None)
        tokenizer = None
        if resume_from is not None:
            self._check_resume_compatible(resume_from)
            tokenizer = Tokenizer.load(resume_from / checkpoint.TOKENIZER)
        torch.manual_seed(cfg.seed)
        with distributed.main_first():  # rank 0 trains and saves the tokenizer; the others read it
            if tokenizer is None and not distributed.is_main():
                tokenizer = Tokenizer.load(self.run_dir / checkpoint.TOKENIZER)
            self.tokenizer, self.train_enc, self.valid, self.valid_enc = self._load_data(tokenizer)
        self.model = build_model(cfg.model, self.tokenizer.vocab_size, self.tokenizer.pad_id).to(self.device)
        self.ddp = distributed.wrap(self.model, self.device)
        distributed.seed_dropout(cfg.seed)
        self.optimizer = make_optimizer(self.model, t, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        if distributed.is_main():
            (self.run_dir / checkpoint.CONFIG).write_text(dump(cfg), encoding="utf-8")
        if resume_from is not None:
            self._restore(resume_from)
            if self.state.step >= t.max_steps:
                self.log(f"already at max_steps ({t.max_steps}); nothing to do (raise train.max_steps to go on)")
                return Result(self.state, "finished", 0, self.run_dir)
        n_params = sum(p.numel() for p in self.model.parameters())
        self.log(f"model: {n_params:,} parameters on {self.device} in {cfg.precision}")
        return self._loop()

    def _loop(self) -> Result:
        cfg, t = self.cfg, self.cfg.train
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        bar = tqdm(total=t.max_steps, initial=self.state.step, disable=self.quiet, file=sys.stderr,
                   dynamic_ncols=True, unit="step")
        self.model.train()
        start = time.monotonic() - self.state.elapsed
        window_tokens, window_start = 0, time.monotonic()
        last_eval_step = -1
        reason = "max_epochs"
        try:
            while self.state.epoch < t.max_epochs:
                batches = make_batches(self.train_enc, t.batch_tokens, cfg.seed, self.state.epoch,
                                       shuffle=True, pad_multiple=t.pad_multiple)
                stop = None
                while self.state.batch_in_epoch < len(batches):
                    i = self.state.batch_in_epoch
                    micro = batches[i:i + t.accumulate * distributed.world_size()]  # the update's, all ranks'
                    out = self._update(micro)
                    self.state.batch_in_epoch = i + len(micro)
                    self.state.step += 1
                    self.state.elapsed = time.monotonic() - start
                    bar.update(1)
                    if out is None:
                        self.state.skipped_steps += 1
                        self.state.bad_in_a_row += 1
                        if self.state.bad_in_a_row >= t.max_bad_steps:
                            stop = "non_finite"
                            break
                    else:
                        loss, nll, tokens = out
                        self.state.bad_in_a_row = 0
                        self.state.last_finite_loss = loss
                        self.state.target_tokens += tokens
                        window_tokens += tokens
                        if self.state.step % t.log_every == 0:
                            now = time.monotonic()
                            tps = window_tokens / max(now - window_start, 1e-9)
                            window_tokens, window_start = 0, now
                            lr = self.optimizer.param_groups[0]["lr"]
                            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}")
                            self._record({"step": self.state.step, "kind": "train", "loss": loss, "nll": nll,
                                          "ppl": math.exp(min(nll, 50.0)), "lr": lr, "target_tokens_per_s": tps,
                                          "skipped_steps": self.state.skipped_steps, "elapsed_s": self.state.elapsed})
                    if self.state.step % t.eval_every == 0:
                        self._evaluate_and_keep_best()
                        last_eval_step = self.state.step
                        if self.state.evals_without_gain >= t.patience:
                            stop = "early_stopping"
                    if self.state.step % t.save_every == 0:
                        self._save("periodic")
                    self._agree_on_stop()
                    if self.stop_signal is not None:
                        stop = "signal"
                    elif self.state.step >= t.max_steps:
                        stop = "max_steps"
                    elif t.max_minutes is not None and self.state.elapsed >= t.max_minutes * 60:
                        stop = "max_minutes"
                    if stop:
                        break
                if stop:
                    reason = stop
                    break
                self.state.epoch += 1
                self.state.batch_in_epoch = 0
        finally:
            bar.close()
        return self._finish(reason, last_eval_step, handlers)

    def _finish(self, reason: str, last_eval_step: int, handlers: dict[int, Any]) -> Result:
        code = 0
        if reason == "non_finite":
            lr = self.optimizer.param_groups[0]["lr"]
            self.log(f"stopped: {self.cfg.train.max_bad_steps} updates in a row with non-finite loss or gradients at "
                     f"step {self.state.step} (last finite loss {self.state.last_finite_loss:.4f}, lr {lr:.2e}, "
                     f"loss scale {self.scaler.get_scale() if self.scaler.is_enabled() else 1.0}); lower train.peak_lr "
                     "or train.lr_factor, or use precision: bf16 or fp32. Checkpoints before this point are intact.")
            code = 1
        elif reason == "signal":
            code = 128 + int(self.stop_signal or signal.SIGINT)
        else:
            if last_eval_step != self.state.step:
                self._evaluate_and_keep_best()
        if reason != "non_finite":
            self._save(reason)
        for s, h in handlers.items():
            signal.signal(s, h)
        self.log(f"{reason}: step {self.state.step}, best valid BLEU {self.state.best_bleu:.2f}, "
                 f"{self.state.skipped_steps} skipped updates; checkpoints in {self.run_dir}")
        return Result(self.state, reason, code, self.run_dir)
