"""tfm serve under generated requests (any method, path, headers and JSON, decode settings and numbers past any range)
while slow clients stall hundreds of connections: every request gets an answer below 500, and a good one still gets
200."""

from __future__ import annotations

import http.client
import json
import socket

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from serve_helpers import post, serving, translator_of

from transformer import checkpoint
from transformer.serving.checks import Limits

SERVED = Limits(max_connections=64, header_timeout_s=5.0, body_timeout_s=5.0)
STALLS = [
    b"",  # connected, nothing sent
    b"P",
    b"POST /translate HTTP/1.1\r\nHost: tfm\r\n",  # a request line and a header, then nothing
    b"POST /translate HTTP/1.1\r\nHost: tfm\r\nContent-Length: 100\r\n\r\n" + b'{"text": [',  # part of a body
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.sampled_from([10**400, -(10**30), 1e308, -0.0, 2**63, 17]),
    st.text(st.characters(blacklist_categories=[]), max_size=40),  # lone surrogates included
)
values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=10,
)
numbers = st.one_of(
    st.integers(-5, 20),
    st.integers(-5, 20),
    st.integers(),
    st.floats(),
    st.sampled_from([10**400, 1e308, 2**63, 1000]),
    values,
)
sentences_ = st.lists(st.text(st.characters(blacklist_categories=[]), max_size=40), max_size=4)
requests_ = st.one_of(
    st.fixed_dictionaries(  # POST /translate's keys
        {"text": st.one_of(sentences_, sentences_, values)},
        optional={
            "beam": numbers,
            "alpha": numbers,
            "nbest": numbers,
            "sample": values,
            "temperature": numbers,
            "top_k": numbers,
            "top_p": numbers,
            "seed": numbers,
            "to": values,
            "align": values,
        },
    ),
    st.fixed_dictionaries(  # POST /attention's
        {"text": st.one_of(sentences_.map(" ".join), values)}, optional={"layer": numbers}
    ),
)


def bodies() -> st.SearchStrategy[bytes]:
    as_json = requests_.map(lambda obj: json.dumps(obj).encode("utf-8", "surrogatepass"))
    others = values.map(lambda obj: json.dumps(obj).encode("utf-8", "surrogatepass")) | st.binary(max_size=64)
    return st.one_of(as_json, as_json, as_json, others)


@pytest.fixture(scope="module")
def served(tiny_run):
    """tfm serve's app on the tiny run's best checkpoint, in a thread, with a small connection limit."""
    loaded = checkpoint.load(tiny_run.run_dir / "best")
    with serving(loaded, SERVED, translator_of(loaded)) as url:
        yield url


@settings(max_examples=60, deadline=None)
@given(
    route=st.one_of(
        st.just(("POST", "/translate")),
        st.just(("POST", "/translate")),
        st.just(("POST", "/attention")),
        st.tuples(
            st.sampled_from(["POST", "GET", "PUT", "DELETE", "HEAD", "OPTIONS"]),
            st.sampled_from(["/translate", "/attention", "/health", "/info", "/", "/nowhere", "/%ff"]),
        ),
    ),
    body=bodies(),
    kind=st.sampled_from(["application/json", "text/plain", ""]),
    stalled=st.sampled_from([0, 3, 80]),
    stall=st.sampled_from(STALLS),
)
def test_the_server_answers_any_request_below_500_while_slow_clients_stall(served, route, body, kind, stalled, stall):
    method, path = route
    host, port = served.removeprefix("http://").split(":")
    slow = []
    try:
        for _ in range(stalled):
            slow.append(socket.create_connection((host, int(port))))
            if stall:
                slow[-1].sendall(stall)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request(method, path, body=body, headers={"Content-Type": kind} if kind else {})
        response = conn.getresponse()
        answer = response.read()
        conn.close()
        event(f"{method} {path}: {response.status}")
        event(f"{stalled} stalled")
        assert response.status < 500, (method, path, body, response.status, answer)
        assert post(served, "/translate", {"text": ["Ein Hund läuft."]})[0] == 200  # and the server goes on
    finally:
        for sock in slow:
            sock.close()
