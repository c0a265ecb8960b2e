"""train.compile and train.cuda_graphs: refused in one line where they cannot run (a CPU, fp16's loss scaling,
several processes), accepted where they can."""

import pytest
import torch

from transformer.config import TrainConfig
from transformer.errors import ConfigError
from transformer.runtime.gpu_switches import check_gpu_switches

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(
    "switches, precision, device, world, message",
    [
        ({"compile": True}, "fp32", CPU, 1, "train.compile: true needs a CUDA GPU but the device is cpu"),
        ({"cuda_graphs": True}, "bf16", CPU, 1, "train.cuda_graphs: true needs a CUDA GPU but the device is cpu"),
        ({"cuda_graphs": True}, "fp16", CUDA, 1, "does not work with precision fp16 .* use bf16 or fp32"),
        ({"cuda_graphs": True}, "bf16", CUDA, 2, "runs in one process only, not under torchrun"),
    ],
)
def test_gpu_switches_are_refused_where_they_cannot_run(switches, precision, device, world, message):
    with pytest.raises(ConfigError, match=message):
        check_gpu_switches(TrainConfig(**switches), precision, device, world)


def test_gpu_switches_run_where_they_can():
    check_gpu_switches(TrainConfig(cuda_graphs=True, static_shapes=True), "bf16", CUDA, 1)
    check_gpu_switches(TrainConfig(compile=True), "fp16", CUDA, 4)
    check_gpu_switches(TrainConfig(), "fp16", CPU, 2)
