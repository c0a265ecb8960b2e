"""The Batcher: it loads the model in its own thread; concurrent requests of one setting share a chunk, answers
equal the Translator's, one request's failure (out of memory, a bug) stays its own, the queue is bounded and
closing fails what waits."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time

import pytest

from transformer.decoding.translator import TranslateOptions, Translator
from transformer.serving.batcher import Batcher, Busy, Closed, OutOfMemory

SENTENCES = ["Ein Mann fährt Fahrrad.", "Der Hund läuft im Park.", "", "Zwei Kinder spielen.", "Eine Frau liest."]


@pytest.fixture(scope="module")
def translator(tiny_checkpoint) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint, TranslateOptions("cpu"))


def lengths(translator: Translator, lines: list[str]) -> list[int]:
    return [len(translator.tokenizer.encode(line)) for line in lines]


def texts(out) -> list[list[str]]:
    return [t.texts for t in out]


def hold(batcher: Batcher) -> threading.Event:
    """Keep the worker busy until the returned event is set, so that requests queue up meanwhile."""
    release, started = threading.Event(), threading.Event()
    batcher.run(lambda: (started.set(), release.wait(30)))
    started.wait(30)
    return release


def test_requests_queued_together_share_one_chunk_and_get_the_translators_answers(translator):
    batcher = Batcher(lambda: translator, max_wait=0.0, max_pending=100)
    try:
        release = hold(batcher)
        futures = [batcher.translate([s], lengths(translator, [s]), translator.decode) for s in SENTENCES]
        release.set()
        answers = [f.result(30) for f in futures]
        assert batcher.chunks == 1
        assert [texts(a) for a in answers] == [texts(translator.translate_chunk([s])) for s in SENTENCES]
    finally:
        batcher.close()


def test_different_settings_are_never_mixed_and_chunks_stay_within_the_token_budget(translator):
    budget = sum(lengths(translator, SENTENCES[:2]))
    small = translator.with_decode(dataclasses.replace(translator.decode, batch_tokens=budget))
    batcher = Batcher(lambda: small, max_wait=0.0, max_pending=100)
    greedy = dataclasses.replace(small.decode, beam=1)
    try:
        release = hold(batcher)
        futures = [batcher.translate([s], lengths(small, [s]), small.decode) for s in SENTENCES]
        futures += [batcher.translate([s], lengths(small, [s]), greedy) for s in SENTENCES]
        release.set()
        answers = [f.result(30) for f in futures]
        assert batcher.chunks >= 4  # at least two chunks of each setting: five sentences exceed the budget
        expected = [texts(small.translate_chunk([s])) for s in SENTENCES]
        expected += [texts(small.with_decode(greedy).translate_chunk([s])) for s in SENTENCES]
        assert [texts(a) for a in answers] == expected
    finally:
        batcher.close()


def test_out_of_memory_fails_only_the_request_that_fails_alone(translator, monkeypatch):
    real = Translator.translate_chunk

    def short_of_memory(self, lines, first_line_no=1, prefixes=None, align=False):
        if "Riesig" in lines:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(self, lines, first_line_no)

    monkeypatch.setattr(Translator, "translate_chunk", short_of_memory)
    batcher = Batcher(lambda: translator, max_wait=0.0, max_pending=100)
    try:
        release = hold(batcher)
        lines = [["Ein Mann."], ["Riesig"], ["Der Hund."]]
        futures = [batcher.translate(x, lengths(translator, x), translator.decode) for x in lines]
        release.set()
        with pytest.raises(OutOfMemory):
            futures[1].result(30)
        assert texts(futures[0].result(30)) == texts(real(translator, ["Ein Mann."]))
        assert texts(futures[2].result(30)) == texts(real(translator, ["Der Hund."]))
        after = batcher.translate(["Ein Mann."], [3], translator.decode).result(30)
        assert texts(after) == texts(real(translator, ["Ein Mann."]))
    finally:
        batcher.close()


def test_a_bug_fails_its_chunk_and_the_worker_goes_on(translator, monkeypatch):
    real = Translator.translate_chunk
    calls = []

    def broken_once(self, lines, first_line_no=1, prefixes=None, align=False):
        calls.append(lines)
        if len(calls) == 1:
            raise ValueError("a bug")
        return real(self, lines, first_line_no)

    monkeypatch.setattr(Translator, "translate_chunk", broken_once)
    batcher = Batcher(lambda: translator, max_wait=0.0, max_pending=100)
    try:
        with pytest.raises(ValueError, match="a bug"):
            batcher.translate(["Ein Mann."], [3], translator.decode).result(30)
        assert texts(batcher.translate(["Ein Mann."], [3], translator.decode).result(30))
        assert batcher.run(lambda: 1 / 0).exception(30).__class__ is ZeroDivisionError
        assert batcher.alive
    finally:
        batcher.close()


def test_the_queue_is_bounded_by_sentences(translator):
    batcher = Batcher(lambda: translator, max_wait=0.0, max_pending=3)
    try:
        release = hold(batcher)
        first = batcher.translate(["a", "b"], [1, 1], translator.decode)
        with pytest.raises(Busy):
            batcher.translate(["c", "d"], [1, 1], translator.decode)
        assert batcher.pending == 2
        release.set()
        assert len(first.result(30)) == 2
        assert len(batcher.translate(["c", "d"], [1, 1], translator.decode).result(30)) == 2
    finally:
        batcher.close()


def test_a_request_whose_client_left_is_skipped(translator):
    batcher = Batcher(lambda: translator, max_wait=0.0, max_pending=100)
    try:
        release = hold(batcher)
        gone = batcher.translate(["Ein Mann."], [3], translator.decode)
        kept = batcher.translate(["Der Hund."], [3], translator.decode)
        assert gone.cancel()
        release.set()
        assert texts(kept.result(30)) == texts(translator.translate_chunk(["Der Hund."]))
    finally:
        batcher.close()


def test_close_fails_what_waits_finishes_what_runs_and_refuses_more(translator):
    batcher = Batcher(lambda: translator, max_wait=0.0, max_pending=100)
    release = hold(batcher)
    waiting = batcher.translate(["Ein Mann."], [3], translator.decode)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    with pytest.raises(Closed):
        waiting.result(30)
    release.set()
    closer.join(30)
    assert not closer.is_alive() and not batcher.alive
    with pytest.raises(Closed):
        batcher.translate(["Ein Mann."], [3], translator.decode)


def test_the_worker_loads_the_model_and_translates_in_its_own_thread(translator, monkeypatch):
    """All of the model's tensor work happens in one thread, which then owns OpenMP's only pool of threads."""
    threads = []
    real = Translator.translate_chunk

    def load() -> Translator:
        threads.append(threading.current_thread())
        return translator

    def noted(self, lines, first_line_no=1, prefixes=None, align=False):
        threads.append(threading.current_thread())
        return real(self, lines, first_line_no)

    monkeypatch.setattr(Translator, "translate_chunk", noted)
    batcher = Batcher(load, max_wait=0.0, max_pending=100)
    try:
        assert batcher.translator is translator
        batcher.translate(["Ein Mann."], [3], translator.decode).result(30)
        assert len(threads) == 2 and threads[0] is threads[1] is not threading.current_thread()
    finally:
        batcher.close()


def test_a_failed_load_is_raised_by_the_constructor():
    def load() -> Translator:
        raise FileNotFoundError("no checkpoint here")

    with pytest.raises(FileNotFoundError, match="no checkpoint here"):
        Batcher(load, max_wait=0.0, max_pending=100)


def test_ctrl_c_while_loading_stops_the_worker_once_it_has_loaded(translator):
    """The worker is not left inside torch when the process exits (that aborts it): it finishes loading, then stops."""
    loading, sent, loaded = threading.Event(), threading.Event(), threading.Event()

    def load() -> Translator:
        loading.set()
        sent.wait(30)  # loading outlasts the signal however late a busy machine runs the interrupting thread
        time.sleep(0.3)
        loaded.set()
        return translator

    def interrupt() -> None:
        loading.wait(30)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        sent.set()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C's, also where the tests run with
    try:  # SIGINT ignored (started with nohup or &, as tests/cli_helpers.py notes)
        threading.Thread(target=interrupt).start()
        with pytest.raises(KeyboardInterrupt):
            Batcher(load, max_wait=0.0, max_pending=100)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert loaded.is_set()
    assert not any(t.name == "tfm-serve-model" for t in threading.enumerate())
