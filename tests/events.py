"""A run's TensorBoard events read back with tensorboard's own reader, as ``tensorboard --logdir`` shows them, and
compared with the run's log.jsonl."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from transformer.plots import read_log
from transformer.training.tensorboard_log import FOLDER, SCALARS

INSTALLED = importlib.util.find_spec("tensorboard") is not None


def read_events(run_dir: Path) -> Any:
    """An EventAccumulator of ``run_dir``'s events, every value kept (TensorBoard's default keeps a sample)."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    return ea.EventAccumulator(str(run_dir / FOLDER), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0}).Reload()


def scalars(events: Any, tag: str) -> list[tuple[int, float]]:
    """A scalar's (step, value) pairs in the order TensorBoard holds them."""
    return [(e.step, e.value) for e in events.Scalars(tag)]


def assert_events_match_log(run_dir: Path) -> None:
    """Every scalar has one value per step that log.jsonl logged, the value it last logged there (float32, as
    TensorBoard stores it); a kind of record log.jsonl has none of has no scalars."""
    events, log = read_events(run_dir), read_log(run_dir)
    present = set(events.Tags()["scalars"])
    assert present <= {tag for tags in SCALARS.values() for tag in tags.values()}
    for kind, tags in SCALARS.items():
        for key, tag in tags.items():
            logged = [(e["step"], pytest.approx(e[key], rel=1e-6)) for e in log[kind]]
            assert (scalars(events, tag) if tag in present else []) == logged, tag
