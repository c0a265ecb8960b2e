"""Standard streams whose reader went away (``tfm train ... | head``): training goes on and writes its messages
nowhere, instead of dying at the next progress line with no checkpoint. log.jsonl keeps the record."""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import TextIO


class Unbroken(io.TextIOBase):
    """A text stream that, once its reader has closed the pipe, drops what is written instead of raising."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            self._guard(lambda: self.stream.write(text))
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            self._guard(self.stream.flush)

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return not self.gone and self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    def _guard(self, write) -> None:
        try:
            write()
        except OSError as e:
            if not isinstance(e, BrokenPipeError) and e.errno != errno.EPIPE:
                raise
            self.gone = True
            # the interpreter flushes the real stream at exit: point its descriptor at /dev/null first
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())


def keep_going_without_readers() -> None:
    """Wrap stdout and stderr so that a closed pipe on either never stops this process."""
    sys.stdout = Unbroken(sys.stdout)
    sys.stderr = Unbroken(sys.stderr)
