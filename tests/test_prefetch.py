"""prefetch.ahead is map(make, items) made ahead in a background thread: the same results in the same order, errors
where they belong, a thread that stops when the loop is left, and training that logs the same losses with it."""

from __future__ import annotations

import json
import threading
import time
from contextlib import closing

import pytest
import torch
from tiny import run_trainer, tiny_config

from transformer import checkpoint
from transformer.training import trainer as train_module
from transformer.training.prefetch import ahead

THREAD = "tfm-prefetch"


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD and t.is_alive()]


def _no_prefetch_thread_soon(seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while _prefetch_threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _wait_until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def _losses(run_dir):
    lines = (run_dir / "log.jsonl").read_text().splitlines()
    return [(e["step"], e["loss"]) for e in map(json.loads, lines) if e["kind"] == "train"]


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_results_are_maps_in_order(depth):
    threads: set[str] = set()

    def make(i):
        threads.add(threading.current_thread().name)
        if i % 7 == 0:
            time.sleep(0.002)  # an uneven pace, so the queue fills and drains
        return (i, i * i)

    items = (i for i in range(50))  # a one-pass iterator, read by the background thread
    assert list(ahead(make, items, depth)) == list(map(lambda i: (i, i * i), range(50)))
    assert threads == ({THREAD} if depth else {threading.current_thread().name})
    assert list(ahead(make, [], depth)) == []
    assert _no_prefetch_thread_soon()


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_an_error_in_make_surfaces_after_the_earlier_results(depth):
    k = 4

    def make(i):
        if i == k:
            raise ValueError(f"bad item {i}")
        return i * 10

    got = []
    with pytest.raises(ValueError, match="bad item 4"):
        for x in ahead(make, range(20), depth):
            got.append(x)
    assert got == [i * 10 for i in range(k)]
    assert _no_prefetch_thread_soon()


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("slow_make", [False, True])
def test_leaving_the_loop_early_stops_the_thread(depth, slow_make):
    """The thread holds at most ``depth`` results in its queue and one more in hand, waiting for room: so
    ``make`` has run for at most consumed + depth + 1 items, before and after the generator is closed."""
    calls = []

    def make(i):
        calls.append(i)
        if slow_make:
            time.sleep(0.02)
        return i

    consumed = 5
    with closing(ahead(make, range(10_000), depth)) as it:
        for n, x in enumerate(it, 1):
            assert x == n - 1
            if n == consumed:
                _wait_until(lambda: len(calls) >= consumed + depth + 1)  # let it run as far ahead as it may
                time.sleep(0.05)
                assert consumed < len(calls) <= consumed + depth + 1
                break
    assert _no_prefetch_thread_soon()
    made = len(calls)
    time.sleep(0.1)
    assert len(calls) == made <= consumed + depth + 1
    assert calls == list(range(made))


@pytest.mark.parametrize("depth", [1, 2])
def test_an_exception_in_the_loop_body_stops_the_thread(depth):
    calls = []

    def make(i):
        calls.append(i)
        return i

    with pytest.raises(KeyError):
        with closing(ahead(make, range(10_000), depth)) as it:
            for x in it:
                if x == 2:
                    raise KeyError(x)
    assert _no_prefetch_thread_soon()
    made = len(calls)
    time.sleep(0.05)
    assert len(calls) == made <= 3 + depth + 1


def _watch_collation(monkeypatch) -> list[tuple[int, str]]:
    """(depth, thread name) of every update the Trainer collates through prefetch.ahead."""
    seen: list[tuple[int, str]] = []
    real = train_module.ahead

    def watched(make, items, depth):
        return real(lambda item: (seen.append((depth, threading.current_thread().name)), make(item))[1], items, depth)

    monkeypatch.setattr(train_module, "ahead", watched)
    return seen


def test_training_with_prefetch_logs_the_same_losses(tmp_path, monkeypatch):
    """38 updates (the sample's epoch is 35 batches of 300 tokens: an epoch boundary in between), validated on the
    way."""
    train = {"max_steps": 38, "eval_every": 20, "save_every": 1000}
    runs, seen = {}, _watch_collation(monkeypatch)
    for prefetch in (0, 2):
        seen.clear()
        cfg = tiny_config(tmp_path / f"p{prefetch}", model={"dropout": 0.0}, train={**train, "prefetch": prefetch})
        assert run_trainer(cfg).reason == "max_steps"
        runs[prefetch] = _losses(cfg.out_dir)
        # every update was collated at the configured depth, in the background thread when there is one
        assert len(seen) >= 38 and set(seen) == {(prefetch, THREAD if prefetch else threading.main_thread().name)}
    assert [s for s, _ in runs[0]] == list(range(1, 39))
    assert runs[2] == runs[0]
    assert _no_prefetch_thread_soon()


def test_a_run_stopped_mid_epoch_resumes_exactly_with_prefetch(tmp_path):
    """Stopped after 3 of the epoch's 35 batches (with updates 4 and 5 already collated ahead), then resumed with
    prefetch 2: the losses and weights of an uninterrupted run without prefetch."""
    whole = tiny_config(tmp_path / "a", train={"max_steps": 6, "save_every": 3, "prefetch": 0})
    run_trainer(whole)
    first = run_trainer(tiny_config(tmp_path / "b", train={"max_steps": 3, "save_every": 3, "prefetch": 2}))
    assert first.state.step == 3 and first.state.epoch == 0 and first.state.batch_in_epoch == 3
    rest = tiny_config(tmp_path / "b", train={"max_steps": 6, "save_every": 3, "prefetch": 2})
    run_trainer(rest, resume=True)
    assert [s for s, _ in _losses(whole.out_dir)] == list(range(1, 7))
    assert _losses(rest.out_dir) == _losses(whole.out_dir)
    a = checkpoint.load(checkpoint.step_dirs(whole.out_dir)[-1]).model.state_dict()
    b = checkpoint.load(checkpoint.step_dirs(rest.out_dir)[-1]).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _no_prefetch_thread_soon()
