"""The optimizer of the paper (section 5.3): Adam, and its learning-rate schedule or the same shape with a stated peak.

Paper: lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
With ``peak_lr`` set: lr = peak_lr * min(step / warmup, (warmup / step)^0.5), the
inverse square root of fairseq, which rises linearly to ``peak_lr`` at ``warmup``.
"""

from __future__ import annotations

import torch

from transformer.config import TrainConfig


def fused_adam(device: torch.device) -> bool:
    """Whether Adam's fused kernel (one pass over all parameters, not a loop per tensor) runs on ``device``."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and torch.torch_version.TorchVersion(torch.__version__) >= (2, 4)


def make_optimizer(
    model: torch.nn.Module, t: TrainConfig, device: torch.device, lr: float = 0.0, fused: bool | None = None
) -> torch.optim.Adam:
    """Adam with the config's betas, eps and weight decay (the schedule sets lr at every update).

    Fused (one kernel for all parameters, not a loop per tensor) on CUDA, and on the CPU where torch
    has it, unless ``fused`` says otherwise; measured by ``python -m bench.levers`` ("fused Adam").
    """
    fused = fused_adam(device) if fused is None else fused
    return torch.optim.Adam(
        model.parameters(), lr=lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay, fused=fused or None
    )


def learning_rate(step: int, train: TrainConfig, d_model: int) -> float:
    """Learning rate for optimizer update ``step`` (counted from 1)."""
    step = max(step, 1)
    w = train.warmup
    if train.peak_lr is not None:
        return train.peak_lr * min(step / w, (w / step) ** 0.5)
    return train.lr_factor * d_model**-0.5 * min(step**-0.5, step * w**-1.5)
