"""A training run's clock: time since the start, the throughput of the updates alone, and the time set aside.

Validation and saving are timed apart (``aside``) and left out of the logged throughput, so a window
that holds a validation still says how fast the updates ran. Every duration of a run is read from
``clock``, which the tests replace with a clock they move by hand.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from transformer.training.forecast import TIMED_UPDATES
from transformer.training.train_state import TrainState


def clock() -> float:
    """Seconds on the monotonic clock."""
    return time.monotonic()


def process_started() -> float:
    """When this process started, on ``clock``: what a user waits through before training counts from there (Python,
    torch's import). Linux tells it in /proc; elsewhere it is now."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # the name, in (), may hold spaces
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks after boot
    except (OSError, ValueError, IndexError):
        age = 0.0
    return clock() - max(age, 0.0)


class Meter:
    """Times a run from ``state`` on (a resumed run's clock goes on from its saved elapsed time)."""

    def __init__(self, state: TrainState) -> None:
        self.state = state
        self.start = clock() - state.elapsed
        self.first_step = state.step + 1  # it pays for warm-up, so the forecast times the updates after it
        self.timed_from = 0.0
        self.window_tokens, self.window_start, self.window_aside = 0, clock(), self._aside_s()
        self.window_flops, self.window_end = 0.0, self.window_start

    def since_start(self) -> float:
        """Seconds since the run began, the earlier parts of a resumed run included."""
        return clock() - self.start

    def tick(self) -> None:
        """After an update is queued: the run's elapsed time, and the end of the throughput window so far."""
        self.state.elapsed = self.since_start()
        self.window_end = clock()
        if self.state.step == self.first_step:
            self.timed_from = self.window_end

    def book(self, tokens: int, flops: float) -> None:
        """An update's target tokens (0 if it was skipped) and model FLOPs, once the device has done it."""
        self.window_tokens += tokens
        self.window_flops += flops

    def seconds_per_update(self) -> float | None:
        """Seconds an update took over the ``TIMED_UPDATES`` after the first, once, right after them; else None."""
        if self.state.step != self.first_step + TIMED_UPDATES:
            return None
        return (clock() - self.timed_from) / TIMED_UPDATES

    def throughput(self) -> tuple[float, float]:
        """Target tokens and model FLOPs per second of the updates booked since the last call, over the time from
        then to the queueing of the latest update, time set aside left out; starts a new window."""
        aside = self._aside_s()
        seconds = max(self.window_end - self.window_start - (aside - self.window_aside), 1e-9)
        rates = self.window_tokens / seconds, self.window_flops / seconds
        self.window_tokens, self.window_flops, self.window_start, self.window_aside = 0, 0.0, self.window_end, aside
        return rates

    @contextlib.contextmanager
    def aside(self, kind: str) -> Iterator[None]:
        """Time the block as ``kind`` (``valid`` or ``save``), which the throughput leaves out."""
        began = clock()
        try:
            yield
        finally:
            setattr(self.state, f"{kind}_s", getattr(self.state, f"{kind}_s") + clock() - began)

    def split(self) -> dict[str, float]:
        """Where the run's time went since it began."""
        total = self.since_start()
        s = self.state
        return {"seconds": total, "train_s": total - s.valid_s - s.save_s, "valid_s": s.valid_s, "save_s": s.save_s}

    def _aside_s(self) -> float:
        return self.state.valid_s + self.state.save_s
