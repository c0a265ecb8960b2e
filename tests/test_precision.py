"""Precisions: names and what each needs refused in one line, the autocast each runs under, and auto by rule where
one decides."""

from __future__ import annotations

import pytest
import torch

from transformer.errors import ConfigError
from transformer.runtime.precision import autocast, check_precision, cpu_multiplies_bf16, training_precision

CPU = torch.device("cpu")


# ----- names and checks -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("training, names", [(True, "fp32, bf16, fp16, auto"), (False, "fp32, bf16, fp16, int8, auto")])
def test_unknown_names_are_one_line_naming_the_known(training, names):
    with pytest.raises(ConfigError, match=f"precision 'fp8' is not one of {names}; pick one of them"):
        check_precision("fp8", CPU, training)
    if training:
        with pytest.raises(ConfigError, match="precision 'int8' is not one of"):
            check_precision("int8", CPU, training)
    else:
        check_precision("int8", CPU, training)


def test_fp16_needs_a_gpu_and_int8_the_cpu():
    with pytest.raises(ConfigError, match="precision: fp16 needs a CUDA GPU but the device is cpu"):
        check_precision("fp16", CPU, training=True)
    check_precision("fp16", torch.device("cuda"), training=False)
    with pytest.raises(ConfigError, match="int8 decodes on the CPU only"):
        check_precision("int8", torch.device("cuda"), training=False)


def test_autocast_only_below_fp32():
    assert not torch.is_autocast_enabled("cpu")
    for name, on in (("fp32", False), ("int8", False), ("bf16", True)):
        with autocast(name, CPU):
            assert torch.is_autocast_enabled("cpu") == on


# ----- auto --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capability, name", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp16"), ((7, 0), "fp16")])
def test_auto_on_cuda_is_bf16_from_ampere_and_fp16_before(capability, name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert training_precision("auto", torch.device("cuda")) == name


@pytest.mark.parametrize(
    "amx, measured, name", [(True, "fp32", "bf16"), (False, "bf16", "bf16"), (False, "fp32", "fp32")]
)
def test_auto_training_on_a_cpu_is_bf16_with_amx_else_what_was_measured(amx, measured, name, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert training_precision("auto", CPU, lambda: measured) == name
    assert training_precision("auto", CPU) == ("bf16" if amx else "fp32")  # unmeasured: fp32
    assert training_precision("auto", torch.device("mps"), lambda: "bf16") == "fp32"
    assert [training_precision(p, CPU, lambda: "bf16") for p in ("fp32", "bf16")] == ["fp32", "bf16"]


def test_auto_is_fp32_on_a_torch_that_cannot_tell_amx(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert training_precision("auto", CPU) == "fp32"


def test_a_cpu_multiplies_bf16_in_hardware_with_avx512_bf16_or_amx(monkeypatch):
    for bf16, amx, want in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda bf16=bf16: bf16, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx, raising=False)
        assert cpu_multiplies_bf16() is want
