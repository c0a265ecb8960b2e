"""Training switches that run on a CUDA GPU only (``train.compile``, ``train.cuda_graphs``), checked against the
device, the precision and the processes a run trains in, before anything is written."""

from __future__ import annotations

import torch

from transformer.config import TrainConfig
from transformer.errors import ConfigError
from transformer.runtime.precision import PRECISIONS


def check_gpu_switches(train: TrainConfig, precision: str, device: torch.device, world: int) -> None:
    """train.compile and train.cuda_graphs run on CUDA only (on a CPU both measured slower or do not exist), compile
    with torch 2.6 or newer (validation runs the compiled layers eagerly); graphs replay no loss scale, so they need
    bf16 or fp32, and run in one process (``world``: the processes training together)."""
    for key, on in (("train.compile", train.compile), ("train.cuda_graphs", train.cuda_graphs)):
        if on and device.type != "cuda":
            raise ConfigError(f"{key}: true needs a CUDA GPU but the device is {device.type}; set {key}: false")
    if train.compile and not hasattr(torch.compiler, "set_stance"):
        raise ConfigError(
            f"train.compile: true needs torch 2.6 or newer (this is {torch.__version__}); "
            "upgrade torch or set train.compile: false"
        )
    if train.cuda_graphs and PRECISIONS[precision].loss_scaling:
        raise ConfigError(
            "train.cuda_graphs: true does not work with precision fp16 (loss scaling); use bf16 or fp32, "
            "or set train.cuda_graphs: false"
        )
    if train.cuda_graphs and world > 1:
        raise ConfigError(
            "train.cuda_graphs: true runs in one process only, not under torchrun; set train.cuda_graphs: false"
        )
