"""The search's crossings between host and device: what it must read of the device in one wait, what it sends in none.

On a GPU, reading a device tensor on the host (``tolist``, ``item``, ``cpu``) waits until every queued kernel has run,
and so does copying a Python list to the device from ordinary memory. The search decides a few things per step on the
host (which hypotheses ended, which sentences leave); it reads them here, together, and sends its indices back through
pinned memory without waiting, so a step waits for the device once (twice when hypotheses end, for their tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_host(*tensors: Tensor) -> list[Tensor]:
    """The tensors (on one device) as host tensors, after at most one wait for the device."""
    if tensors[0].device.type != "cuda":
        return [t.cpu() for t in tensors]
    copies = [t.to("cpu", non_blocking=True) for t in tensors]  # into pinned memory, queued behind the kernels
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return copies


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A Python list as a tensor on ``device``, queued without waiting for the device."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)
