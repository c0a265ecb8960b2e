"""The one route of a run's log records: each goes to log.jsonl and, when on, to TensorBoard, from rank 0 only.

A record is a dict with ``step`` and ``kind`` (``start``, ``train``, ``valid`` or ``end``). Every sink gets every
record, in order, and writes it through before the next: the two logs cannot disagree, and an interrupted run
leaves both complete up to its last record. log.jsonl is appended to, so a resumed run goes on in the same file
(a reader keeps a repeated step's last record, as ``transformer.plots.read_log`` does).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from transformer.storage import manifest
from transformer.training import distributed
from transformer.training.tensorboard_log import TensorBoardLog

LOG = "log.jsonl"


class Sink(Protocol):
    """Somewhere log records are written."""

    def write(self, entry: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonLines:
    """``log.jsonl``: one JSON object a line, appended, each line on disk once written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: each record is flushed
        manifest.record(path.parent, path.name, grows=True)  # tfm's, as it is now and whatever it appends

    def write(self, entry: dict[str, Any]) -> None:
        self.file.write(json.dumps(entry) + "\n")

    def close(self) -> None:
        self.file.close()
        manifest.record(self.path.parent, self.path.name, grows=True)


class RunLog:
    """Writes each record to every sink; a context that closes them all however the run ends."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def record(self, entry: dict[str, Any]) -> None:
        """Write one record to every sink."""
        for sink in self.sinks:
            sink.write(entry)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for sink in self.sinks:
            sink.close()


def open_run_log(run_dir: Path, tensorboard: bool, first_step: int, config_yaml: str) -> RunLog:
    """Rank 0's log of the run in ``run_dir`` from update ``first_step`` on (the other ranks' writes nowhere)."""
    if not distributed.is_main():
        return RunLog([])
    sinks: list[Sink] = [JsonLines(run_dir / LOG)]
    if tensorboard:
        sinks.append(TensorBoardLog(run_dir, first_step, config_yaml))
    return RunLog(sinks)
