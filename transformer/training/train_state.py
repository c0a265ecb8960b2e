"""Where training stands, and the trainer state a resumable checkpoint holds beside the weights.

``trainer.pt`` keeps the TrainState (step, data position, best score, counters), the optimizer's and
the gradient scaler's state and the RNG states, so that a resumed run continues as if never stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch


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
    valid_s: float = 0.0
    save_s: float = 0.0
    target_tokens: int = 0


def capture(state: TrainState, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> dict[str, Any]:
    """The trainer state to save: plain tensors and numbers only, so it loads with ``weights_only=True``."""
    return {
        "state": asdict(state),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "cpu_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore(saved: dict[str, Any], optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> TrainState:
    """Put back what ``capture`` saved into the optimizer, the scaler and the RNGs; return the TrainState."""
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    torch.set_rng_state(saved["cpu_rng"])
    if saved["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    known = {f.name for f in fields(TrainState)}  # a state saved by earlier code may hold fields since retired
    return TrainState(**{k: v for k, v in saved["state"].items() if k in known})
