"""Pictures: a run's training curves, and heatmaps of one translated sentence's attention (decoding.attention_maps).

matplotlib is optional (the ``plot`` extra, or ``pip install matplotlib``); it is imported only when a
picture is drawn, through its object API (``Figure``), so no pyplot state or GUI backend is touched.
Figures have a fixed size in pixels: ``CURVES_SIZE`` for the curves, ``PANEL_SIZE`` per attention
head, heads in rows of at most ``GRID_COLUMNS``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from transformer.decoding.attention_maps import AttentionMaps
from transformer.errors import PlotError
from transformer.storage import manifest
from transformer.storage.files import atomic_file, cannot_write

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
CURVES_SIZE = (1200, 360)  # pixels: loss, learning rate, validation BLEU side by side
PANEL_SIZE = (450, 400)  # pixels per attention head
GRID_COLUMNS = 4
CURVES = "training.png"  # in the run directory, where ``tfm plot`` draws by default
TWENTY = 20.0  # minutes: the budget tfm's quick comparisons use, marked on the learning curve


def _figure(pixels: tuple[int, int]) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("drawing needs matplotlib, which is not installed; pip install matplotlib") from None
    return Figure(figsize=(pixels[0] / DPI, pixels[1] / DPI), dpi=DPI)


def _save(fig: Figure, output: Path) -> Path:
    """Write the PNG: a file aside first, then renamed into place (a device such as /dev/null as it is); a failed
    write (a full disk, /dev/full) is one line naming the output."""
    try:
        with atomic_file(output, "wb") as f:
            fig.savefig(f, format="png", dpi=DPI)
    except OSError as e:
        raise cannot_write(output, e) from None
    return output


# ----- training curves ------------------------------------------------------------------------------------


def read_log(run_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The run's ``log.jsonl`` as 'train' and 'valid' entries by step; a resumed run's repeated steps keep the last."""
    path = Path(run_dir) / "log.jsonl"
    if not path.exists():
        raise PlotError(f"{path} not found; pass a run directory such as runs/<name> (tfm train writes log.jsonl)")
    by_step: dict[str, dict[int, dict[str, Any]]] = {"train": {}, "valid": {}}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise PlotError(f"{path} cannot be read ({e.strerror}); tfm train writes it as a file: restore it") from None
    for line in lines:
        try:
            entry = json.loads(line.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError too: a damaged line, or one cut short by a crash, tells nothing
            continue
        if isinstance(entry, dict) and entry.get("kind") in by_step and "step" in entry:
            by_step[entry["kind"]][entry["step"]] = entry
    if not by_step["train"] and not by_step["valid"]:
        raise PlotError(f"{path} has no training or validation entries yet; train for train.log_every steps first")
    return {kind: [entries[s] for s in sorted(entries)] for kind, entries in by_step.items()}


def _series(entries: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    kept = [e for e in entries if isinstance(e.get(key), (int, float))]
    return [e["step"] for e in kept], [e[key] for e in kept]


def _clock(train: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray] | None:
    """Steps and wall-clock minutes from the elapsed time training entries record; None with fewer than two."""
    timed = [(e["step"], e["elapsed_s"] / 60) for e in train if isinstance(e.get("elapsed_s"), (int, float))]
    if len(timed) < 2:
        return None
    steps, minutes = (np.array(v, dtype=float) for v in zip(*timed))
    return steps, minutes


def landmarks(log: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """The validation a user had after 20 minutes (the last one by then) and the best one, each with its step,
    minute and BLEU; a landmark the log cannot place is left out."""
    clock = _clock(log["train"])
    valid = [e for e in log["valid"] if isinstance(e.get("valid_bleu"), (int, float))]
    if clock is None or not valid:
        return {}
    marks = [
        {"step": e["step"], "minutes": float(np.interp(e["step"], *clock)), "bleu": e["valid_bleu"]} for e in valid
    ]
    found = {"best": max(marks, key=lambda m: m["bleu"])}
    if clock[1][-1] >= TWENTY and (by_twenty := [m for m in marks if m["minutes"] <= TWENTY]):
        found["20 min"] = by_twenty[-1]
    return found


def _minutes_axis(ax: Axes, log: dict[str, list[dict[str, Any]]]) -> None:
    """A top axis in wall-clock minutes, the 20th minute marked, and the 20-minute and best validations labelled."""
    clock = _clock(log["train"])
    if clock is None:
        return
    steps, minutes = clock
    top = ax.secondary_xaxis(
        "top", functions=(lambda s: np.interp(s, steps, minutes), lambda m: np.interp(m, minutes, steps))
    )
    top.set_xlabel("minutes")
    if minutes[-1] > TWENTY:
        ax.axvline(float(np.interp(TWENTY, minutes, steps)), color="gray", linestyle=":", linewidth=1)
    marks = landmarks(log)
    middle = (steps[0] + steps[-1]) / 2, max((m["bleu"] for m in marks.values()), default=0) / 2
    for name, mark in marks.items():
        left, low = mark["step"] < middle[0], mark["bleu"] < middle[1]  # labels run toward the middle
        ax.plot(mark["step"], mark["bleu"], "*", color="black", markersize=9)
        ax.annotate(
            f"{name}: BLEU {mark['bleu']:.1f} at minute {mark['minutes']:.0f}",
            (mark["step"], mark["bleu"]),
            textcoords="offset points",
            xytext=(6 if left else -6, 6 if low else -24),
            ha="left" if left else "right",
            fontsize=8,
        )


def plot_training(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Training and validation loss, learning rate and validation BLEU against steps (BLEU also against minutes);
    returns the PNG's path."""
    run_dir = Path(run_dir)
    log = read_log(run_dir)
    fig = _figure(CURVES_SIZE)
    loss_ax, lr_ax, bleu_ax = fig.subplots(1, 3)
    loss_ax.plot(*_series(log["train"], "loss"), label="train", linewidth=1)
    loss_ax.plot(*_series(log["valid"], "valid_loss"), "o-", label="valid", markersize=3)
    loss_ax.set(title="label-smoothed loss", xlabel="step")
    loss_ax.legend()
    lr_ax.plot(*_series(log["train"], "lr"), color="tab:green", linewidth=1)
    lr_ax.set(title="learning rate", xlabel="step")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    bleu_ax.plot(*_series(log["valid"], "valid_bleu"), "o-", color="tab:red", markersize=3)
    bleu_ax.set(title="validation BLEU (greedy)", xlabel="step")
    _minutes_axis(bleu_ax, log)
    for ax in (loss_ax, lr_ax, bleu_ax):
        ax.grid(alpha=0.3)
    fig.suptitle(run_dir.name, fontsize=10)
    fig.tight_layout()
    if output is not None:
        return _save(fig, Path(output))
    output = run_dir / CURVES
    if output.exists() and not manifest.is_own(output):
        raise PlotError(f"{output} was not drawn by tfm (or was changed since); move it, or pass --output")
    _save(fig, output)
    if manifest.read(run_dir) is not None:
        manifest.record(run_dir, CURVES)
    return output


# ----- attention ------------------------------------------------------------------------------------------


def _heatmap(fig: Figure, ax: Axes, maps: AttentionMaps, head: int) -> None:
    image = ax.imshow(maps.weights[head].numpy(), cmap="viridis", vmin=0.0, aspect="auto")
    size = max(4.0, min(9.0, 170 / max(len(maps.rows), len(maps.cols))))
    ax.set_xticks(range(len(maps.cols)), maps.cols, rotation=90, fontsize=size)
    ax.set_yticks(range(len(maps.rows)), maps.rows, fontsize=size)
    ax.set_title(f"layer {maps.layer + 1}, head {head + 1}", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)


def attention_size(n_heads: int) -> tuple[int, int]:
    """The picture's size in pixels for ``n_heads`` panels."""
    cols = min(n_heads, GRID_COLUMNS)
    return PANEL_SIZE[0] * cols, PANEL_SIZE[1] * math.ceil(n_heads / cols)


def plot_attention(maps: AttentionMaps, output: str | Path, head: int | None = None) -> Path:
    """A heatmap of one head (0-based), or of every head in a grid when ``head`` is None; returns the PNG's path."""
    n_heads = maps.weights.size(0)
    if head is not None and not 0 <= head < n_heads:
        raise PlotError(f"head {head + 1} does not exist; the model has heads 1..{n_heads} (or 'all')")
    heads = list(range(n_heads)) if head is None else [head]
    fig = _figure(attention_size(len(heads)))
    cols = min(len(heads), GRID_COLUMNS)
    axes = fig.subplots(math.ceil(len(heads) / cols), cols, squeeze=False).flatten()
    for ax, h in zip(axes, heads):
        _heatmap(fig, ax, maps, h)
    for ax in axes[len(heads) :]:
        ax.set_visible(False)
    what = {
        "cross": "encoder-decoder attention",
        "encoder": "encoder self-attention",
        "decoder": "decoder self-attention",
    }[maps.kind]
    fig.suptitle(f"{what}: \u2192 {maps.translation}", fontsize=10)
    fig.tight_layout()
    return _save(fig, Path(output))
