"""Devices: the name a config or a flag gives (auto, cpu, cuda, cuda:N, mps) as a torch device, and the training
switches that need a CUDA GPU."""

from __future__ import annotations

import torch

from transformer.config import DEVICE, TrainConfig
from transformer.errors import ConfigError
from transformer.precision import PRECISIONS


def resolve_device(name: str) -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; ``cuda:N`` picks a GPU; a device that is absent or unknown is a
    config error (never a checkpoint error: a good checkpoint must not look damaged because of the device)."""
    name = name.strip().lower()
    if name.startswith("cuda:"):
        count, index = torch.cuda.device_count(), name[len("cuda:") :]
        if count == 0:
            raise ConfigError(
                f"device '{name}': this machine has no CUDA GPU (or torch is a CPU build); use auto or cpu"
            )
        if not index.isdigit() or int(index) >= count:
            raise ConfigError(f"device '{name}': this machine has {count} CUDA GPU(s); use cuda:0 to cuda:{count - 1}")
        return torch.device(name)
    if not DEVICE.fullmatch(name):
        hint = " (a GPU is 'cuda')" if name == "gpu" else ""
        raise ConfigError(f"device '{name}' is not one of auto, cpu, cuda, cuda:N, mps{hint}; pick one of them")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device: cuda but this machine has no CUDA GPU (or torch is a CPU build); use device: auto or cpu"
        )
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device: mps but MPS is not available here; use device: auto or cpu")
    return torch.device(name)


def check_gpu_switches(train: TrainConfig, precision: str, device: torch.device) -> None:
    """train.compile and train.cuda_graphs run on CUDA only (on a CPU both measured slower or do not exist), compile
    with torch 2.6 or newer (validation runs the compiled layers eagerly); graphs replay no loss scale, so they need
    bf16 or fp32."""
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
