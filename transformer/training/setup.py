"""What a training run needs, prepared once and in one order before its first update; the loop
(transformer.training.trainer) receives it whole.

``placed`` runs before anything is written: the device, whether the model fits there, the precision (``auto``
resolved, so that the run's config.yaml records what it trains in) and the GPU switches. ``prepare`` then, with the
run directory held: the run directory (fresh, overwritten or resumed), the data and its tokenizer, the model, the
optimizer and the update, and where training stands (restored from the checkpoint when resuming). The order of the
random draws is fixed here: the seed, then the model's initialisation, then dropout's seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from transformer import checkpoint
from transformer.config import Config
from transformer.config_file import dump
from transformer.measured import measured_training
from transformer.model.transformer import Transformer
from transformer.runtime.device import resolve_device
from transformer.runtime.gpu_switches import check_gpu_switches
from transformer.runtime.memory import check_fits
from transformer.runtime.precision import PRECISIONS, training_precision
from transformer.text.corpus import locate
from transformer.text.directions import direction_data
from transformer.text.tokenizer import Tokenizer
from transformer.training import distributed, init, run_dir, train_data, train_state
from transformer.training.schedule import make_optimizer
from transformer.training.train_data import TrainingData
from transformer.training.train_state import TrainState
from transformer.training.update import Updater


def placed(cfg: Config, resume: bool, log: Callable[[str], None]) -> tuple[Config, torch.device]:
    """``cfg`` with its precision and the model it starts from (``train.init``, unless resuming) resolved, and the
    device it trains on; refuses what cannot run there. The data is found before the precision is chosen: ``auto``
    on a CPU without AMX measures both precisions, the one slow step here."""
    cfg = cfg if resume else init.resolve(cfg, log)
    # a CPU without AMX is measured, by one process only (ranks under torchrun keep fp32 rather than each choose)
    world = distributed.launched_world()
    measured = (lambda: measured_training(cfg.model, cfg.tokenizer.vocab_size, log)) if world == 1 else None
    device = resolve_device(cfg.device, distributed.local_rank())
    check_fits(cfg.model, cfg.tokenizer.vocab_size, device, True, "the config's model")
    for src, tgt in cfg.data.pairs():
        locate(direction_data(cfg.data, src, tgt))
    precision = training_precision(cfg.precision, device, measured)
    check_gpu_switches(cfg.train, precision, device, world)
    return replace(cfg, precision=precision), device


@dataclass
class Run:
    """A prepared run: its resolved config and device, its data, the model and the update that trains it, and where
    training stands."""

    cfg: Config
    device: torch.device
    data: TrainingData
    model: Transformer
    update: Updater
    state: TrainState
    config_yaml: str

    @property
    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer."""
        return self.data.tokenizer

    @property
    def out_dir(self) -> Path:
        """The run directory."""
        return self.cfg.out_dir


def prepare(cfg: Config, device: torch.device, resume: bool, overwrite: bool, log: Callable[[str], None]) -> Run:
    """Everything the run needs, in order; rank 0 prepares the run directory and the tokenizer, the others follow."""
    resume_from = run_dir.prepare(cfg.out_dir, resume, overwrite, log) if distributed.is_main() else None
    resume_from = distributed.from_main(resume_from)  # every rank resumes from rank 0's choice
    tokenizer, parent = None, None
    if resume_from is not None:
        run_dir.check_compatible(cfg, resume_from)
        cfg = init.carried(cfg, checkpoint.read_config(resume_from))
        tokenizer = Tokenizer.load(resume_from / checkpoint.TOKENIZER)
    elif cfg.train.init is not None:
        parent = init.parent(cfg, device, log)
        tokenizer = init.tokenizer(parent, cfg, distributed.is_main())
    torch.manual_seed(cfg.seed)
    with distributed.main_first():  # rank 0 trains and saves the tokenizer; the others read it
        if tokenizer is None and not distributed.is_main():
            tokenizer = Tokenizer.load(cfg.out_dir / checkpoint.TOKENIZER)
        data = train_data.read_splits(cfg, cfg.out_dir, tokenizer, log)
    model = Transformer(cfg.model, data.tokenizer.vocab_size, data.tokenizer.pad_id).to(device)
    if parent is not None:
        init.load_weights(model, parent)
    ddp = distributed.wrap(model, device)
    distributed.seed_dropout(cfg.seed)
    optimizer = make_optimizer(model, cfg.train, device)
    scaler = torch.amp.GradScaler(device.type, enabled=PRECISIONS[cfg.precision].loss_scaling)
    update = Updater(cfg, device, model, ddp, optimizer, scaler)
    config_yaml = dump(cfg)
    if distributed.is_main():
        run_dir.write_file(cfg.out_dir, checkpoint.CONFIG, config_yaml)
    state = TrainState() if resume_from is None else _restored(resume_from, cfg, device, model, update, log)
    return Run(cfg, device, data, model, update, state, config_yaml)


def _restored(
    ckpt_dir: Path, cfg: Config, device: torch.device, model: Transformer, update: Updater, log: Callable[[str], None]
) -> TrainState:
    """Weights, optimizer, scaler and RNGs put back as ``ckpt_dir`` saved them; its TrainState."""
    model.load_state_dict(checkpoint.load(ckpt_dir, device).model.state_dict())
    saved = checkpoint.load_trainer_state(ckpt_dir)
    state = train_state.restore(saved, update.optimizer, update.scaler)
    update.resume(state.bad_in_a_row)
    distributed.restore_rng(saved.get("rank_rng"), device, cfg.seed, state.step, log)
    log(f"resumed from {ckpt_dir} at step {state.step}")
    return state
