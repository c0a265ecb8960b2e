"""The learning-rate schedule of the paper (section 5.3), or the same shape with a stated peak.

Paper: lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
With ``peak_lr`` set: lr = peak_lr * min(step / warmup, (warmup / step)^0.5), the
inverse square root of fairseq, which rises linearly to ``peak_lr`` at ``warmup``.
"""

from __future__ import annotations

from transformer.config import TrainConfig


def learning_rate(step: int, train: TrainConfig, d_model: int) -> float:
    """Learning rate for optimizer update ``step`` (counted from 1)."""
    step = max(step, 1)
    w = train.warmup
    if train.peak_lr is not None:
        return train.peak_lr * min(step / w, (w / step) ** 0.5)
    return train.lr_factor * d_model ** -0.5 * min(step ** -0.5, step * w ** -1.5)
