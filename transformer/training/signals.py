"""SIGINT and SIGTERM during training: the first asks to stop after the current update, a second stops at once.

The first signal is only recorded, so the trainer can finish the update and save a resumable checkpoint;
a second one exits straight away (the last complete checkpoint is intact, saves being atomic).
"""

from __future__ import annotations

import signal
from types import FrameType, TracebackType
from typing import Any, Callable

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """A context in which SIGINT/SIGTERM set ``signum`` instead of interrupting; the old handlers return after it."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.signum: int | None = None
        self.training = False  # False during set-up, before there is an update to finish
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self._previous = {s: signal.signal(s, self._on_signal) for s in HANDLED}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def exit_code(self) -> int:
        """The shell's code for death by the signal received: 128 + its number."""
        return 128 + int(self.signum or signal.SIGINT)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None:
            self.log("second interrupt: stopping now; the last complete checkpoint is intact")
            raise SystemExit(128 + signum)
        self.signum = signum
        if not self.training:
            self.log(
                f"{signal.Signals(signum).name}: stopping once this set-up step ends (interrupt again to stop at once)"
            )
            return
        self.log(
            f"{signal.Signals(signum).name}: finishing this update, then saving a resumable checkpoint "
            "(interrupt again to stop at once)"
        )
