"""bench.gpu_step's profile section: a training system's updates under torch.profiler, GPU time by kernel family."""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any, Protocol

import torch


class Profiled(Protocol):
    """A training system: the device it runs on, and updates ``first + 1 .. first + count`` run to the end."""

    device: torch.device

    def run(self, first: int, count: int) -> None: ...


FAMILIES = [  # kernel name pattern -> family, first match wins
    ("triton (compiled)", r"triton"),
    ("matmul", r"gemm|nvjet|xmma|cutlass|cublas|s\d+816|wgmma"),
    ("attention", r"fmha|flash|attention|attn"),
    ("optimizer", r"adam|multi_tensor|foreach|norm_kernel_cuda|lpnorm"),
    ("layer norm", r"layer_norm|layernorm"),
    ("dropout", r"dropout|bernoulli|philox"),
    ("softmax / loss", r"softmax|logsumexp|nll|cross_entropy|scatter|gather"),
    ("reduction", r"reduce"),
    ("copy / cast / fill", r"copy|cast|convert|fill|memset|memcpy|index"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
]


def family(name: str) -> str:
    """The family of kernel ``name``: the first of FAMILIES whose pattern it matches, else other."""
    for fam, pattern in FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return fam
    return "other"


def profile(system: Profiled, start: int, updates: int) -> dict[str, Any]:
    """One system's updates ``start + 1 .. start + updates`` under torch.profiler: per-update wall and GPU busy time,
    kernel launches, GPU time by kernel family (CPU only: operator time, no kernels)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = system.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        began = time.perf_counter()
        system.run(start, updates)
        wall = (time.perf_counter() - began) / updates
    kernels: Counter = Counter()
    by_family: Counter = Counter()
    count = 0
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time if hasattr(e, "device_time") else e.cuda_time
            kernels[e.name] += us
            by_family[family(e.name)] += us
            count += 1
    busy = sum(by_family.values()) / 1e6 / updates
    out = {
        "wall_s_per_update": wall,
        "gpu_busy_s_per_update": busy if cuda else None,
        "gpu_busy_share": busy / wall if cuda else None,
        "kernels_per_update": count / updates if cuda else None,
        "gpu_s_per_update_by_family": {k: v / 1e6 / updates for k, v in by_family.most_common()},
        "top_kernels_s_per_update": {k[:120]: v / 1e6 / updates for k, v in kernels.most_common(12)},
    }
    if not cuda:
        ops = prof.key_averages()
        out["top_ops_cpu_s_per_update"] = {
            o.key: o.self_cpu_time_total / 1e6 / updates for o in sorted(ops, key=lambda o: -o.self_cpu_time_total)[:12]
        }
    print(
        f"  wall {wall * 1e3:.1f} ms/update"
        + (f", GPU busy {busy * 1e3:.1f} ms ({busy / wall:.0%}), {count / updates:.0f} kernels/update" if cuda else ""),
        flush=True,
    )
    for k, v in list(out["gpu_s_per_update_by_family"].items())[:8]:
        print(f"    {k:>20}: {v * 1e3:6.2f} ms", flush=True)
    return out
