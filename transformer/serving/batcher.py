"""One worker thread owns the model and drains a queue of requests, translating concurrent ones together.

The worker also loads the model: the thread that does a process's first parallel torch work keeps OpenMP's pool
of threads for it, and a second such thread (the main one, having loaded the checkpoint) would make two pools
contend for the cores, which OpenMP answers by waking its threads from sleep for every operation.

The worker takes the oldest request, waits up to ``max_wait`` seconds for more with the same decode settings
until their source tokens reach the Translator's ``batch_tokens``, and translates them as one chunk (sorted and
batched by tokens inside, as a file is). Out of memory on a joint chunk retries each request alone, so only
one that fails by itself fails. Other work on the model (the page's attention) runs alone, in the same thread.
Requests waiting are bounded by sentences; past the bound a request is refused at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from transformer.config import DecodeConfig
from transformer.decoding.translator import Translator
from transformer.errors import out_of_memory


class Busy(Exception):
    """Too many sentences are waiting already: the client should retry later."""


class Closed(Exception):
    """The batcher is stopping or stopped: no new work is taken."""


class OutOfMemory(Exception):
    """A request that does not fit in memory even when translated alone."""


@dataclass
class _Job:
    """A request in the queue: lines to translate with ``decode``, or, with ``call`` set, work to run alone."""

    future: Future
    lines: list[str] = field(default_factory=list)
    tokens: int = 0
    decode: DecodeConfig | None = None
    align: bool = False
    call: Callable[[], Any] | None = None

    def joins(self, other: _Job) -> bool:
        """Whether the two translate as one chunk: the same settings, and no sampling (a request's draws are seeded by
        its own line numbers, whatever else the server decodes with it)."""
        return (self.decode, self.align) == (other.decode, other.align) and not (self.decode and self.decode.sample)


class Batcher:
    """The model's one worker thread and its queue: ``translate`` and ``run`` return futures the worker completes."""

    def __init__(self, load: Callable[[], Translator], max_wait: float, max_pending: int) -> None:
        """Start the worker, which first calls ``load`` for the Translator; returns once it has, raising what
        ``load`` raised."""
        self.max_wait = max_wait
        self.max_pending = max_pending
        self.pending = 0  # sentences in the queue
        self.chunks = 0  # chunks translated: fewer than requests when requests were joined
        self._jobs: deque[_Job] = deque()
        self._ready = threading.Condition()
        self._closed = False
        loading: Future[Translator] = Future()
        self._thread = threading.Thread(target=self._work, args=(load, loading), name="tfm-serve-model", daemon=True)
        try:
            self._thread.start()
            self.translator = loading.result()
        except KeyboardInterrupt:  # Ctrl-C while starting or loading: exiting with the worker inside torch would
            if self._thread.is_alive():  # abort the process, so the worker stops once it has loaded
                self.close()
            raise
        self.max_tokens = self.translator.decode.batch_tokens

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running and taking work."""
        return self._thread.is_alive() and not self._closed

    def translate(self, lines: list[str], lengths: list[int], decode: DecodeConfig, align: bool = False) -> Future:
        """Queue ``lines`` (``lengths``: their source tokens); the future gives one Translation per line, as
        ``Translator.translate_chunk`` would."""
        return self._put(_Job(Future(), list(lines), sum(lengths), decode, align))

    def run(self, call: Callable[[], Any]) -> Future:
        """Queue ``call`` to run in the worker thread, alone (the model is never used by two threads)."""
        return self._put(_Job(Future(), call=call))

    def _put(self, job: _Job) -> Future:
        with self._ready:
            if self._closed:
                raise Closed("the server is stopping")
            if self.pending + len(job.lines) > self.max_pending and self._jobs:
                raise Busy(f"{self.pending} sentences are waiting already")
            self._jobs.append(job)
            self.pending += len(job.lines)
            self._ready.notify()
        return job.future

    def close(self) -> None:
        """Take no more work, fail what waits with Closed, and wait for the chunk being translated to finish."""
        with self._ready:
            self._closed = True
            waiting = list(self._jobs)
            self._jobs.clear()
            self.pending = 0
            self._ready.notify()
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(Closed("the server stopped before this request was translated"))
        self._thread.join()

    def _work(self, load: Callable[[], Translator], loading: Future[Translator]) -> None:
        try:
            loading.set_result(load())
        except BaseException as e:  # noqa: BLE001 - the constructor raises it in the caller's thread
            loading.set_exception(e)
            return
        while (jobs := self._next()) is not None:
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]  # a client that left is skipped
            if len(jobs) == 1 and jobs[0].call is not None:
                self._call(jobs[0])
            elif jobs:
                self._translate(jobs)
                self.chunks += 1

    def _next(self) -> list[_Job] | None:
        """The next work: a call alone, or the oldest request with the ones queued with its settings, up to
        ``max_tokens`` (waiting up to ``max_wait`` for more while under it). None once closed."""
        with self._ready:
            while not self._jobs and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            first = self._jobs[0]
            if first.call is not None:
                self._jobs.popleft()
                return [first]
            deadline = time.monotonic() + self.max_wait
            while self._tokens_like(first) < self.max_tokens and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            taken, tokens = [], 0
            for job in list(self._jobs):
                if job is first or (first.joins(job) and (not taken or tokens + job.tokens <= self.max_tokens)):
                    taken.append(job)
                    tokens += job.tokens
                    self._jobs.remove(job)
            self.pending -= sum(len(j.lines) for j in taken)
            return taken

    def _tokens_like(self, first: _Job) -> int:
        return sum(j.tokens for j in self._jobs if j is first or first.joins(j))

    def _call(self, job: _Job) -> None:
        try:
            job.future.set_result(job.call())
        except Exception as e:  # noqa: BLE001 - the caller's future carries any failure; the worker goes on
            job.future.set_exception(e)

    def _translate(self, jobs: list[_Job]) -> None:
        translator = self.translator.with_decode(jobs[0].decode)
        try:
            out = translator.translate_chunk([line for j in jobs for line in j.lines], align=jobs[0].align)
        except Exception as e:  # noqa: BLE001 - one failed chunk must not stop the worker
            self._failed(jobs, e)
            return
        start = 0
        for job in jobs:
            job.future.set_result(out[start : start + len(job.lines)])
            start += len(job.lines)

    def _failed(self, jobs: list[_Job], e: Exception) -> None:
        """Out of memory: retry each request of a joint chunk alone, fail one that fails alone. Anything else is a
        bug: each request gets the exception, for its caller to report."""
        if not out_of_memory(e):
            for job in jobs:
                job.future.set_exception(e)
            return
        _free_cache(self.translator.device)
        if len(jobs) == 1:
            jobs[0].future.set_exception(OutOfMemory(str(e).splitlines()[0] if str(e) else "out of memory"))
            return
        for job in jobs:
            self._translate_alone(job)

    def _translate_alone(self, job: _Job) -> None:
        translator = self.translator.with_decode(job.decode)
        try:
            job.future.set_result(translator.translate_chunk(job.lines, align=job.align))
        except Exception as e:  # noqa: BLE001 - as in _failed, for one request
            self._failed([job], e)


def _free_cache(device: torch.device) -> None:
    """Give a GPU's cached blocks back after an allocation failure, so the next request starts clean."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
