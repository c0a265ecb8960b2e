"""Whether a model fits in a device's memory, judged from its shape before anything is allocated or written: a
setting such as ``model.d_model=1073741824`` is refused in one line, not found out by the allocator halfway into a
run."""

from __future__ import annotations

from pathlib import Path

import torch

from transformer.config import ModelConfig
from transformer.errors import ConfigError

# Bytes a parameter takes to train in fp32: the weight, its gradient and Adam's two moments.
TRAINING_BYTES = 16


def parameters(m: ModelConfig, vocab_size: int) -> int:
    """The Transformer's parameter count from its shape: N encoder layers (self-attention, feed-forward, 2 norms), N
    decoder layers (two attentions, feed-forward, 3 norms), the embeddings and generator (one matrix when tied), and
    the final norms of a pre-norm model."""
    d = m.d_model
    attention = 4 * d * d + 4 * d  # W^Q, W^K, W^V stacked, W^O, with biases
    feed_forward = 2 * d * m.d_ff + m.d_ff + d
    norm = 2 * d
    encoder, decoder = m.depths
    layers = encoder * (attention + feed_forward + 2 * norm) + decoder * (2 * attention + feed_forward + 3 * norm)
    return layers + vocab_size * d * (1 if m.tie_embeddings else 3) + (2 * norm if m.norm_first else 0)


def model_bytes(m: ModelConfig, vocab_size: int, training: bool) -> int:
    """Memory the model takes (weights; with gradients and Adam's moments when ``training``), and the sinusoid table
    of its positions, built in float64."""
    per_parameter = TRAINING_BYTES if training else 4
    return parameters(m, vocab_size) * per_parameter + m.max_positions * m.d_model * 8


def available(device: torch.device) -> int | None:
    """Bytes free for a new model on ``device``: free GPU memory, or the memory Linux says is available (within a
    container's limit); None where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        meminfo = Path("/proc/meminfo").read_text(encoding="ascii")
    except OSError:
        return None
    free = next(
        (int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")), None
    )
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text(encoding="ascii").strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text(encoding="ascii"))
        if limit != "max" and free is not None:
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


def check_fits(m: ModelConfig, vocab_size: int, device: torch.device, training: bool, what: str) -> None:
    """Refuse a model whose memory (``model_bytes``) exceeds what ``device`` has free; ``what`` names the settings."""
    need, free = model_bytes(m, vocab_size, training), available(device)
    if free is not None and need > free:
        doing = "train" if training else "load"
        raise ConfigError(
            f"{what}: a model of N={m.N}, d_model={m.d_model}, d_ff={m.d_ff} and {vocab_size:,} tokens needs about "
            f"{need / 2**30:,.1f} GiB to {doing}, and {device} has {free / 2**30:,.1f} GiB free; make it smaller"
        )
