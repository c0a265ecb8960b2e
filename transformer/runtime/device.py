"""Devices: the name a config or a flag gives (auto, cpu, cuda, cuda:N, mps) as a torch device."""

from __future__ import annotations

import torch

from transformer.config import DEVICE
from transformer.errors import ConfigError


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; ``cuda:N`` picks a GPU; a device that is absent or unknown is a
    config error (never a checkpoint error: a good checkpoint must not look damaged because of the device). Under
    torchrun (``local_rank``: the process's LOCAL_RANK) a CUDA device is the process's own GPU."""
    device = _named(name)
    return torch.device("cuda", local_rank) if local_rank is not None and device.type == "cuda" else device


def _named(name: str) -> torch.device:
    """The device ``name`` names, where this machine has it."""
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
