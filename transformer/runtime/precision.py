"""Precisions: their names, what each needs, the autocast each runs under, and the rule that resolves ``auto`` where
one decides.

fp32, bf16 and fp16 train and decode (bf16 and fp16 under autocast; fp16 on a CUDA GPU only, with loss scaling).
int8 decodes only, on a CPU: a copy of the model whose Linear layers hold int8 weights (model.decoding_copy), fp32 in
and out. ``auto`` is resolved before anything runs: on a GPU by its tensor cores (bf16 from compute capability 8.0,
fp16 before), on a CPU with AMX tiles bf16 for training; on other CPUs transformer.measured measures it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ContextManager

import torch

from transformer.errors import ConfigError


@dataclass(frozen=True)
class Precision:
    """A precision's name, the dtype its matmuls run in, whether it trains, and whether its loss needs scaling."""

    name: str
    dtype: torch.dtype
    trains: bool = True
    loss_scaling: bool = False

    @property
    def mixed(self) -> bool:
        """Whether matmuls run below fp32, under autocast (int8's Linear layers take and give fp32)."""
        return self.dtype != torch.float32


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32),
        Precision("bf16", torch.bfloat16),
        Precision("fp16", torch.float16, loss_scaling=True),
        Precision("int8", torch.float32, trains=False),
    )
}
AUTO = "auto"


def check_precision(name: str, device: torch.device, training: bool) -> None:
    """A precision that ``device`` can train (or decode) in, or auto; else a one-line error naming the fix."""
    names = [n for n, p in PRECISIONS.items() if p.trains or not training] + [AUTO]
    if name not in names:
        raise ConfigError(f"precision '{name}' is not one of {', '.join(names)}; pick one of them")
    if name == AUTO:
        return
    if PRECISIONS[name].loss_scaling and device.type != "cuda":
        raise ConfigError(
            f"precision: fp16 needs a CUDA GPU but the device is {device.type}; use precision: bf16 or fp32"
        )
    if not PRECISIONS[name].trains:
        if device.type != "cpu":
            raise ConfigError(f"precision int8 decodes on the CPU only, the device is {device.type}; use --device cpu")


def autocast(name: str, device: torch.device) -> ContextManager:
    """The autocast ``name`` runs under: none for fp32 and int8."""
    p = PRECISIONS[name]
    return torch.autocast(device_type=device.type, dtype=p.dtype) if p.mixed else contextlib.nullcontext()


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles, the matrix units that multiply bf16 (torch's own check of the CPU flags)."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private; older torch builds lack it
    return bool(supported and supported())


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX tiles); elsewhere torch emulates bf16 matmuls,
    many times slower than fp32 (torch's own checks of the CPU flags, private ones)."""
    supported = getattr(torch.cpu, "_is_avx512_bf16_supported", None)  # private; older torch builds lack it
    return cpu_has_amx() or bool(supported and supported())


def by_rule(device: torch.device) -> str | None:
    """auto where a rule decides: a GPU by its tensor cores, fp32 off the CPU; None on a CPU."""
    if device.type == "cuda":
        return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    return None if device.type == "cpu" else "fp32"


def training_precision(name: str, device: torch.device, measured: Callable[[], str] | None = None) -> str:
    """What training in ``name`` runs in, once ``check_precision`` has passed it: other names as they are; auto by the
    rule, bf16 on a CPU with AMX, else what ``measured`` finds (transformer.measured; fp32 without it)."""
    check_precision(name, device, training=True)
    if name != AUTO:
        return name
    rule = by_rule(device) or ("bf16" if cpu_has_amx() else None)
    return rule or (measured() if measured is not None else "fp32")
