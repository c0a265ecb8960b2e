"""The search reads the device only through host.to_host, at most twice a step, and host's crossings keep values.

On a GPU each read of a device tensor on the host waits for the device; a CPU cannot show the waits, but it can show
where reads happen: a torch function mode sees every ``tolist``, ``item``, ``bool``, ``nonzero``... and whether the
tensor read came from to_host (or was computed from what it returned).
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from transformer.config import ModelConfig
from transformer.decoding import host
from transformer.decoding.ensemble import Ensemble
from transformer.decoding.search import beam_search, greedy_search
from transformer.model.transformer import Transformer

PAD, START, END = 0, 1, 2
READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero"}


def _reads(func, args, kwargs) -> bool:
    """Whether calling func reads a tensor on the host: a read above, or ``to`` the CPU."""
    name = getattr(func, "__name__", "")
    to_cpu = name == "to" and any(
        str(a) == "cpu" for a in tree_leaves((args, kwargs)) if isinstance(a, (str, torch.device))
    )
    return name in READS or to_cpu


class HostReads(TorchFunctionMode):
    """Records each read on the host of a tensor that to_host did not return, nor was computed from one it did."""

    def __init__(self) -> None:
        super().__init__()
        self.on_host: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()  # by id, while alive
        self.stray: list[str] = []
        self.crossings = 0
        self.crossing = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        from_host = any(self.on_host.get(id(t)) is t for t in inputs)
        if _reads(func, args, kwargs) and not from_host and not self.crossing:
            self.stray.append(func.__name__)
        if from_host:
            self.on_host.update({id(t): t for t in tree_leaves(out) if isinstance(t, Tensor)})
        return out

    def to_host(self, *tensors: Tensor) -> list[Tensor]:
        """host.to_host, its own reads allowed and its results marked as on the host."""
        self.crossings += 1
        self.crossing = True
        try:
            out = REAL_TO_HOST(*tensors)
        finally:
            self.crossing = False
        self.on_host.update({id(t): t for t in out})
        return out


REAL_TO_HOST = host.to_host


def _model(seed: int) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(N=2, d_model=32, d_ff=64, h=4, dropout=0.1, tie_embeddings=False), 23, PAD).eval()
    with torch.no_grad():
        model.generator.weight.mul_(2)
        model.generator.weight[END].mul_(4)  # <END> likely enough that sentences end at different steps
    return model


def _sources() -> Tensor:
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 12, (12,), generator=g)
    src = torch.randint(END + 1, 23, (12, int(lengths.max())), generator=g)
    src[torch.arange(src.size(1)) >= lengths[:, None]] = PAD
    return src


def _steps(model) -> list[int]:
    """Counts the model's decoding steps in the returned list's one element."""
    steps, step = [0], model.decode_step

    def counted(*args):
        steps[0] += 1
        return step(*args)

    model.decode_step = counted
    return steps


@pytest.mark.parametrize("members", [1, 2])
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_the_search_reads_the_device_through_to_host_only_at_most_twice_a_step(monkeypatch, search, members):
    model = _model(0) if members == 1 else Ensemble([_model(0), _model(1)])
    src = _sources()
    steps = _steps(model)
    reads = HostReads()
    monkeypatch.setattr(host, "to_host", reads.to_host)
    with reads:
        if search == "greedy":
            greedy_search(model, src, START, END, max_len_b=8)
        else:
            beam_search(model, src, START, END, beam=4, nbest=2, max_len_b=8)
    assert reads.stray == []
    # One read for the length limits, one per step, and one more in each step where hypotheses end.
    assert steps[0] + 1 < reads.crossings <= 2 * steps[0] + 1


def test_a_stray_read_would_be_seen():
    """The check above can fail: reading a tensor on the host outside to_host is recorded."""
    reads = HostReads()
    with reads:
        x = torch.arange(4)
        x.tolist()
        x.to(torch.uint8)
        x.to("cpu")
        (y,) = reads.to_host(x + 1)
        y[1:].tolist()
    assert reads.stray == ["tolist", "to"] and reads.crossings == 1


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.float32])
def test_crossings_keep_values_and_dtypes(dtype):
    values = [1, 0, 3] if dtype != torch.bool else [True, False, True]
    sent = host.to_device(values, dtype, torch.device("cpu"))
    assert sent.dtype == dtype and sent.tolist() == values
    back = host.to_host(sent, sent[1:])
    assert (
        [t.device.type for t in back] == ["cpu", "cpu"]
        and back[0].tolist() == values
        and back[1].tolist() == values[1:]
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_crossing_queues_without_waiting_then_reads_in_one_wait():
    device = torch.device("cuda")
    torch.cuda.set_sync_debug_mode("error")  # a wait for the device raises
    try:
        x = host.to_device([5, 6, 7], torch.long, device)
        y = x * 2
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [t.tolist() for t in host.to_host(y, x)] == [[10, 12, 14], [5, 6, 7]]
