"""Device and precision from the config: one place that turns names into torch objects."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

from transformer.config import DEVICE, TrainConfig
from transformer.errors import ConfigError


@dataclass(frozen=True)
class Precision:
    """A precision a config names: the dtype matmuls run in, and whether the loss needs scaling (fp16's range)."""

    name: str
    dtype: torch.dtype
    loss_scaling: bool = False

    @property
    def mixed(self) -> bool:
        """Whether matmuls run below fp32, under autocast."""
        return self.dtype != torch.float32


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32),
        Precision("bf16", torch.bfloat16),
        Precision("fp16", torch.float16, True),
    )
}


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


def resolve_precision(name: str, device: torch.device, measure_cpu: Callable[[], str] | None = None) -> str:
    """``auto``: bf16 on a CUDA GPU with bf16 tensor cores (compute capability 8.0 and up), fp16 with loss
    scaling on older ones, bf16 on a CPU with AMX tiles; on other CPUs what ``measure_cpu`` finds faster (fp32
    without it); fp32 elsewhere. Other names are returned as they are.

    With AMX, bf16 autocast trained faster than fp32 on every CPU measured; without it, faster on some and slower
    on others, hence the measurement (transformer.training.cpu_precision).
    """
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    if device.type != "cpu":
        return "fp32"
    if cpu_has_amx():
        return "bf16"
    return measure_cpu() if measure_cpu is not None else "fp32"


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles, the matrix units that multiply bf16 (torch's own check of the CPU flags)."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private; older torch builds lack it
    return bool(supported and supported())


def check_precision(precision: str, device: torch.device) -> Precision:
    """The Precision named fp32, bf16 or fp16; fp16 needs a GPU (CPU fp16 matmuls are slow and GradScaler is
    CUDA-only here)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision '{precision}' is not one of {', '.join(PRECISIONS)}; pick one of them")
    if PRECISIONS[precision].loss_scaling and device.type != "cuda":
        raise ConfigError(
            f"precision: fp16 needs a CUDA GPU but the device is {device.type}; use precision: bf16 or fp32"
        )
    return PRECISIONS[precision]


def autocast(precision: str, device: torch.device) -> ContextManager:
    """Mixed precision for the forward pass; fp32 is a no-op context."""
    p = PRECISIONS[precision]
    return torch.autocast(device_type=device.type, dtype=p.dtype) if p.mixed else contextlib.nullcontext()


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
