"""Device and precision names: precision: auto per device, unknown names refused."""

import pytest
import torch

from transformer.device import check_precision, resolve_device, resolve_precision
from transformer.errors import ConfigError


@pytest.mark.parametrize(
    "capability, precision", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp16"), ((7, 0), "fp16")]
)
def test_auto_precision_on_cuda_is_bf16_from_ampere_and_fp16_before(capability, precision, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_precision("auto", torch.device("cuda")) == precision


@pytest.mark.parametrize("amx, precision", [(True, "bf16"), (False, "fp32")])
def test_auto_precision_on_a_cpu_is_bf16_with_amx_and_fp32_unmeasured(amx, precision, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert resolve_precision("auto", torch.device("cpu")) == precision
    assert resolve_precision("auto", torch.device("mps"), lambda: "bf16") == "fp32"


@pytest.mark.parametrize(
    "amx, measured, precision", [(False, "bf16", "bf16"), (False, "fp32", "fp32"), (True, "fp32", "bf16")]
)
def test_auto_precision_on_a_cpu_without_amx_is_what_the_measurement_finds(amx, measured, precision, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert resolve_precision("auto", torch.device("cpu"), lambda: measured) == precision
    assert resolve_precision("fp32", torch.device("cpu"), lambda: "bf16") == "fp32"  # only auto is measured


def test_auto_precision_is_fp32_on_a_torch_that_cannot_tell_amx(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"


def test_precision_names_pass_through():
    assert [resolve_precision(p, torch.device("cpu")) for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="precision 'fp8' is not one of fp32, bf16, fp16"):
        check_precision("fp8", torch.device("cpu"))


@pytest.mark.parametrize(
    "name, message",
    [
        ("gpu", r"device 'gpu' is not one of auto, cpu, cuda, cuda:N, mps \(a GPU is 'cuda'\)"),
        ("meta", "device 'meta' is not one of"),
        ("cuda:7", "device 'cuda:7'"),
        ("cuda:x", "device 'cuda:x'"),
    ],
)
def test_unknown_or_absent_devices_are_config_errors(name, message):
    if name == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")
    with pytest.raises(ConfigError, match=message):
        resolve_device(name)


def test_device_names_ignore_case_and_spaces():
    assert resolve_device(" CPU ") == torch.device("cpu")
