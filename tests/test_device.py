"""Device names: auto, cpu, cuda, cuda:N, mps; unknown or absent devices refused in one line."""

import pytest
import torch

from transformer.errors import ConfigError
from transformer.runtime.device import resolve_device


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


def test_under_torchrun_a_cuda_device_is_the_process_s_own_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("cuda", 1) == torch.device("cuda", 1)  # LOCAL_RANK 1
    assert resolve_device("auto", 0) == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda")  # one process: the device as named
    assert resolve_device("cpu", 1) == torch.device("cpu")  # ranks on a CPU share it
