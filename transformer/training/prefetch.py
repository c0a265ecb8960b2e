"""Work made ahead in a background thread, so that the GPU does not wait while the host collates the next batches.

The thread only computes what the loop would compute next, in the same order, from the same inputs;
what the loop receives is the same as without it (tests/test_prefetch.py). numpy and torch release
the GIL in the copying that collation is made of, so the thread runs beside the training step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

_DONE = object()


def ahead(make: Callable[[In], Out], items: Iterable[In], depth: int) -> Iterator[Out]:
    """``map(make, items)``, with up to ``depth`` results made ahead by one background thread (none when depth is 0).

    An exception in ``make`` is raised where its result would have been returned. Leaving the loop
    early (break, an exception, a closed generator) stops the thread before it makes more.
    """
    if depth <= 0:
        yield from map(make, items)
        return
    made: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        try:
            for item in items:
                result = make(item)
                while not stop.is_set():
                    try:
                        made.put((True, result), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as e:  # handed to the consumer, which raises it
            made.put((False, e))
            return
        made.put((True, _DONE))

    thread = threading.Thread(target=work, name="tfm-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            ok, result = made.get()
            if not ok:
                raise result
            if result is _DONE:
                return
            yield result
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                made.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)
