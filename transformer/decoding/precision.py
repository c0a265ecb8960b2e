"""The precisions decoding runs in, and the model as each runs it.

fp32 (on the CPU the decoder's matrices laid out for a step's few rows: decoding.speed.for_cpu_decoding), bf16 or
fp16 (autocast over a copy whose weights are cast once: decoding.speed.matmul_weights_in), int8 on the CPU
(decoding.int8); on the CPU every step runs through decoding.lean_step, in fp32 and int8 with cross-attention folded
into its float projections where that reads less (decoding.cross_fold). ``auto`` names none of them: it is
resolved to one first (decoding.auto_precision).
"""

from __future__ import annotations

from typing import ContextManager

import torch
from torch import nn

from transformer.decoding.int8 import INT8, check_int8, int8_copy
from transformer.decoding.lean_step import LeanDecoding
from transformer.decoding.speed import for_cpu_decoding, matmul_weights_in
from transformer.device import PRECISIONS, autocast, check_precision
from transformer.errors import ConfigError
from transformer.model.transformer import Transformer

AUTO = "auto"


def check_decoding_precision(precision: str, device: torch.device) -> None:
    """A precision to decode in: one that training knows (fp32, bf16, fp16), int8 on the CPU, or auto."""
    if precision == INT8:
        check_int8(device)
    elif precision in PRECISIONS:
        check_precision(precision, device)
    elif precision != AUTO:
        names = ", ".join([*PRECISIONS, INT8, AUTO])
        raise ConfigError(f"precision '{precision}' is not one of {names}; pick one of them")


def decoding_model(model: Transformer, precision: str, device: torch.device) -> nn.Module:
    """``model`` as search decodes it in ``precision`` on ``device`` (a copy where the precision needs one)."""
    if precision == INT8:
        return LeanDecoding(int8_copy(model), fold=model)
    if PRECISIONS[precision].mixed:
        model = matmul_weights_in(model, PRECISIONS[precision].dtype)
    elif device.type == "cpu":
        return LeanDecoding(for_cpu_decoding(model.eval(), torch.get_num_threads()), fold=model)
    return LeanDecoding(model) if device.type == "cpu" else model.eval()


def decoding_autocast(precision: str, device: torch.device) -> ContextManager:
    """The autocast a precision decodes under: none for fp32 and int8 (int8's matmuls take fp32 in and out)."""
    return autocast("fp32" if precision == INT8 else precision, device)
