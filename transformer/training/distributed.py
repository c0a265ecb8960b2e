"""Data-parallel training across processes (PyTorch DDP under torchrun): set-up, ranks and the work split.

``torchrun --nproc_per_node N -m cli train ...`` starts N processes and sets RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``init`` joins them into one process group, NCCL on CUDA
(one GPU per process) and Gloo on CPU. Every rank builds the same batch list (it depends only on
seed and epoch), so the split needs no communication: one update takes ``accumulate x world``
consecutive batches, rank r takes every world-th one, and a rank left short on the epoch's last,
uneven update runs a copy of a batch with weight 0. Every rank thus runs the same number of
forward/backward passes per update, the last one synchronised, and no collective waits forever.
The loss is divided by the update's global target-token count, computed on every rank from the
index lists alone.

Without torchrun, or with one process, every helper here is a no-op and training is single-process.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import signal
import sys
from datetime import timedelta
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from transformer.errors import DistributedError

# How long a rank waits at a collective (e.g. while rank 0 validates or saves) before failing with an error.
TIMEOUT = timedelta(minutes=30)


def world_size() -> int:
    """Number of processes training together (1 without torchrun)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's global rank (0 without torchrun)."""
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """True on the one process that logs, validates and saves."""
    return rank() == 0


def launched_world() -> int:
    """Processes torchrun started for this run (1 without torchrun), readable before the process group exists."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 without torchrun), readable before the process group exists."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int | None:
    """This process's GPU under torchrun (its LOCAL_RANK), None without torchrun: where a CUDA run trains."""
    return int(os.environ.get("LOCAL_RANK", "0")) if launched_world() > 1 else None


def init(device: torch.device) -> None:
    """Join torchrun's process group (NCCL for CUDA, Gloo for CPU); nothing to do for a single process."""
    if launched_world() <= 1 or dist.is_initialized():
        return
    if device.type not in ("cuda", "cpu"):
        raise DistributedError(f"distributed training runs on cuda or cpu, not {device.type}; set device: cuda or cpu")
    if device.type == "cuda":
        if device.index >= torch.cuda.device_count():
            raise DistributedError(
                f"local rank {device.index} has no GPU: this machine has "
                f"{torch.cuda.device_count()}; start at most one process per GPU (--nproc_per_node)"
            )
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)


def close() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def unused_gpus_note(device: torch.device) -> str | None:
    """A start-up note when a single process trains on one of several visible GPUs, leaving the others idle."""
    n = torch.cuda.device_count() if device.type == "cuda" else 0
    if n > 1 and world_size() == 1:
        return f"using cuda:0 only of {n} visible GPUs; train on all with tfm train --nproc {n}"
    return None


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """The module to run forward/backward through: DistributedDataParallel when several processes train."""
    if world_size() == 1:
        return model
    ddp = nn.parallel.DistributedDataParallel
    ids = [device.index] if device.type == "cuda" else None
    # The model's only buffer is the constant positional table: nothing to broadcast before each forward.
    # (newer torch names the flag forward_sync_buffers; older versions know only broadcast_buffers.)
    new = "forward_sync_buffers" in inspect.signature(ddp).parameters
    flag = "forward_sync_buffers" if new else "broadcast_buffers"
    return ddp(model, device_ids=ids, **{flag: False})


def seed_dropout(seed: int) -> None:
    """Give each rank its own dropout stream (same seed on every rank would repeat the masks)."""
    if world_size() > 1:
        torch.manual_seed(seed + rank())


def shard(
    micro: Sequence[list[int]], world: int | None = None, rank_: int | None = None
) -> list[tuple[list[int], float]]:
    """A rank's share of one update's batches as (indices, weight); every rank gets the same count.

    Rank r takes batches r, r + world, ...; a rank short of one (uneven last update) gets the
    update's first batch again with weight 0, so it still joins the gradient all-reduce.
    ``world`` and ``rank_`` default to this process's.
    """
    w = world_size() if world is None else world
    r = rank() if rank_ is None else rank_
    count = math.ceil(len(micro) / w)
    mine = [(list(micro[i]), 1.0) for i in range(r, len(micro), w)]
    return mine + [(list(micro[0]), 0.0)] * (count - len(mine))


def target_tokens(tgt_lengths: np.ndarray, micro: Sequence[Sequence[int]]) -> int:
    """Non-pad target tokens (each sentence plus <END>) of all of an update's batches, on every rank alike."""
    return sum(int(tgt_lengths[np.asarray(idx, dtype=np.int64)].sum()) + len(idx) for idx in micro)


def sync_unless(model: nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """DDP's ``no_sync`` for micro-batches before an update's last one: gradients all-reduce once per update."""
    if skip and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``values`` over all ranks."""
    if world_size() == 1:
        return values
    out = values.to(_comm_device())
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(values.device)


def all_max(values: Sequence[float]) -> list[float]:
    """The element-wise maximum of ``values`` over all ranks, so that every rank takes the same decision."""
    if world_size() == 1:
        return list(values)
    out = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out.tolist()


def from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (the other ranks wait here while rank 0 works)."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait until every rank is here."""
    if world_size() > 1:
        dist.barrier()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (training the tokenizer, writing caches); the others then run it too."""
    if not is_main():
        barrier()
    try:
        yield
    finally:
        if is_main():
            barrier()


def _own_rng(device: torch.device) -> dict[str, torch.Tensor]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.empty(0, dtype=torch.uint8)
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def gather_rng(device: torch.device) -> list[dict[str, torch.Tensor]] | None:
    """Every rank's RNG states (for rank 0 to save), or None for a single process."""
    if world_size() == 1:
        return None
    states: list[Any] = [None] * world_size()
    dist.all_gather_object(states, _own_rng(device))
    return states


def restore_rng(
    states: list[dict[str, torch.Tensor]] | None, device: torch.device, seed: int, step: int, log: Callable[[str], None]
) -> None:
    """Put back this rank's saved RNG states; with another world size, re-seed each rank from (seed, step)."""
    if world_size() == 1:
        return
    if states is not None and len(states) == world_size():
        own = states[rank()]
        torch.set_rng_state(own["cpu"])
        if device.type == "cuda" and own["cuda"].numel():
            torch.cuda.set_rng_state(own["cuda"], device)
        return
    torch.manual_seed(seed + rank() + 1_000_003 * step)
    log(
        f"saved with {len(states) if states else 1} process(es), resumed with {world_size()}: dropout re-seeded, "
        "so the run continues correctly but not bit-for-bit"
    )


def launch(nproc: int, args: list[str]) -> int:
    """Run ``torchrun --standalone --nproc_per_node nproc -m cli <args>`` here; the workers' exit code.

    A SIGTERM or Ctrl-C reaches torchrun, which passes it to the workers (each finishes its update, rank 0 saves a
    resumable checkpoint) and raises it here once they have stopped: one line and 128 + the signal, as without
    --nproc, instead of torchrun's traceback.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if launched_world() > 1:
        raise DistributedError("already running under torchrun; drop --nproc (torchrun's --nproc_per_node sets it)")
    import torch.distributed.elastic.agent.server.api  # noqa: F401 - its logger, to quiet below

    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.ERROR)  # the workers say what happens; torchrun's notes repeat it
    try:
        run(get_args_parser().parse_args(["--standalone", f"--nproc_per_node={nproc}", "-m", "cli", *args]))
    except ChildFailedError as e:
        failed_rank, failure = e.get_first_failure()
        code = failure.exitcode
        print(f"error: rank {failed_rank} exited with code {code}; its messages are above", file=sys.stderr)
        return 128 - code if code < 0 else code or 1
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        print(f"stopped by {name}: the run keeps its last checkpoint; continue it with --resume", file=sys.stderr)
        return 128 + int(e.sigval)
    return 0
