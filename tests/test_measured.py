"""Verdicts measured on this machine: the alternated rounds they are measured in."""

from transformer.measured import alternated


def test_every_name_runs_once_untimed_then_in_an_order_reversed_every_other_round():
    calls = []

    def run(name: str) -> int:
        calls.append(name)
        return len(calls)

    results = alternated(("a", "b", "c"), run, rounds=3)
    assert calls == ["a", "b", "c", "a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert results == {"a": [4, 9, 10], "b": [5, 8, 11], "c": [6, 7, 12]}  # the untimed first runs are not kept
