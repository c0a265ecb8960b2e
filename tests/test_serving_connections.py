"""tfm serve's connections, over real sockets: a stalled or slow client is closed at its request's deadline (headers,
then body, however it trickles), a few hundred stalled ones never lock out a client that sends its request, and only
when every connection waits on the model is a new one answered 503."""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import time

import pytest
from serve_helpers import Client, call, post, serve, serving, translator_of

from transformer import checkpoint
from transformer.decoding.translator import Translator
from transformer.serving.checks import Limits

STALL = b"POST /translate HTTP/1.1\r\nHost: tfm\r\n"  # a request line and one header, then nothing
QUICK = Limits(header_timeout_s=0.5, body_timeout_s=1.0)


@pytest.fixture(scope="module")
def loaded(tiny_run):
    return checkpoint.load(tiny_run.run_dir / "best")


@pytest.fixture
def quick(loaded):
    with serving(loaded, QUICK, translator_of(loaded)) as url:
        yield url


def connect(url: str, first: bytes = b"") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    if first:
        sock.sendall(first)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing ``sock`` within ``seconds``; None if it is still open then."""
    deadline, data = time.monotonic() + seconds, b""
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk
    return None


def test_stalled_headers_and_a_header_trickled_byte_by_byte_are_closed_at_the_deadline(quick):
    silent, stalled, trickling = connect(quick), connect(quick, STALL), connect(quick, b"P")
    start = time.monotonic()
    for byte in b"OST /translate HTTP/1.1\r\nHost: tfm\r\n":  # a byte every 0.05 s keeps it from ever being idle
        if closed_within(trickling, 0.05) is not None:
            break
        try:
            trickling.send(bytes([byte]))
        except OSError:
            break
    for sock in (silent, stalled, trickling):
        assert closed_within(sock, 3) is not None
    assert time.monotonic() - start < 3
    assert post(quick, "/translate", {"text": ["Ein Mann."]})[0] == 200


def test_a_body_that_stops_coming_gets_408_and_is_closed(quick):
    sock = connect(quick, b"POST /translate HTTP/1.1\r\nHost: tfm\r\nContent-Length: 100\r\n\r\n" + b'{"text": [')
    answer = closed_within(sock, 4)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408 ")
    assert "did not arrive within 1 s" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]


def test_an_idle_keep_alive_connection_is_closed_at_the_header_deadline(quick):
    client = Client(quick)
    assert client.post("/translate", {"text": ["Ein Mann."]})[0] == 200
    assert closed_within(client.conn.sock, 3) is not None  # idle after its answer: closed at the header deadline
    client.close()


def test_260_stalled_connections_do_not_lock_out_a_client_of_tfm_serve(tiny_run, tmp_path):
    """As a user runs it: 260 connections each send a request line and a header, then stall; a client that sends
    its request is answered at once, and the server holds no more than its 256 connections."""
    proc, url = serve(tiny_run.run_dir / "best", tmp_path / "serve.err")
    stalled = []
    try:
        stalled = [connect(url, STALL) for _ in range(260)]
        start = time.monotonic()
        client = Client(url, timeout=10)
        assert client.post("/translate", {"text": ["Ein Mann fährt Fahrrad."]})[0] == 200
        assert client.call("GET", "/health")[0] == 200
        assert time.monotonic() - start < 5
        client.close()
        closed = [s for s in stalled if closed_within(s, 0.01) is not None]
        assert len(closed) >= 260 + 1 - 256  # the longest stalled made room for the newer ones
    finally:
        for sock in stalled:
            sock.close()
        proc.p.send_signal(signal.SIGTERM)
        proc.finish()


def test_only_when_every_connection_waits_on_the_model_is_a_new_one_refused(loaded):
    entered, gate = threading.Event(), threading.Event()

    class Slow(Translator):
        def translate_chunk(self, lines, first_line_no=1, prefixes=None, align=False):
            entered.set()
            gate.wait(30)
            return super().translate_chunk(lines, first_line_no)

    with serving(loaded, Limits(max_connections=2), translator_of(loaded, Slow)) as url:
        answers = []

        def ask(text: str) -> None:
            answers.append(post(url, "/translate", {"text": [text]}))

        first = threading.Thread(target=ask, args=("a",))
        first.start()
        assert entered.wait(10)
        second = threading.Thread(target=ask, args=("b",))
        second.start()
        time.sleep(1)  # its request sent: both connections now wait on the model
        status, answer = call(url, "GET", "/health")
        assert status == 503 and "all waiting for answers; retry" in answer["error"]
        gate.set()
        for t in (first, second):
            t.join(30)
        assert [a[0] for a in answers] == [200, 200]
        assert call(url, "GET", "/health")[0] == 200
