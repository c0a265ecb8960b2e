"""bench.common.machine: the description every benchmark record carries."""

from importlib import metadata

from bench import common


def test_machine_names_the_peers_versions_and_none_for_a_missing_peer(monkeypatch):
    monkeypatch.setattr(common, "PEERS", ("pytest", "tfm-no-such-peer"))
    described = common.machine()
    assert described["pytest"] == metadata.version("pytest")
    assert described["tfm-no-such-peer"] is None
    assert set(described["cpu_flags"]) <= set(common.MATMUL_FLAGS)
