"""Helpers for tests of tfm serve: HTTP calls with the standard library, an app served by uvicorn in a thread of
the test process, and `tfm serve` in a subprocess (its URL read from the line it prints)."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from cli_helpers import Proc

from transformer.serving.checks import Limits

SERVING = re.compile(r"serving .* on (http://\S+) ")


class Client:
    """One keep-alive connection to the server at ``url``, as an application holds it."""

    def __init__(self, url: str, timeout: float = 120) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)

    def call(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """(status, the JSON answer, or the text of a non-JSON one)."""
        self.conn.request(method, path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        data = response.read()
        if response.getheader("Content-Type", "").startswith("application/json"):
            return response.status, json.loads(data)
        return response.status, data.decode("utf-8")

    def post(self, path: str, obj: Any) -> tuple[int, Any]:
        return self.call("POST", path, json.dumps(obj).encode("utf-8"), {"Content-Type": "application/json"})

    def close(self) -> None:
        self.conn.close()


def call(url: str, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, Any]:
    """One request on a connection of its own."""
    client = Client(url)
    try:
        return client.call(method, path, body, headers)
    finally:
        client.close()


def post(url: str, path: str, obj: Any) -> tuple[int, Any]:
    return call(url, "POST", path, json.dumps(obj).encode("utf-8"))


@contextlib.contextmanager
def in_thread(app: Any, limits: Limits | None = None) -> Iterator[str]:
    """Serve ``app`` with uvicorn as tfm serve does (connections bounded and timed by ``limits``) on 127.0.0.1 (a free
    port) in a thread of this process; yields its URL."""
    import uvicorn

    from transformer.serving.connections import server_config

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(app, limits or Limits(), lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn stopped before it started")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def translator_of(loaded: Any, kind: type | None = None) -> Any:
    """A Translator (or the subclass ``kind``) of a loaded checkpoint on the CPU, with its own decode settings."""
    from transformer.decoding.translator import TranslateOptions, Translator

    return (kind or Translator).from_checkpoint(loaded, TranslateOptions("cpu"))


@contextlib.contextmanager
def serving(loaded: Any, limits: Limits, translator: Any) -> Iterator[str]:
    """tfm serve's app on ``translator`` through a Batcher, served in a thread with ``limits``; yields its URL."""
    from transformer.serving.app import create_app
    from transformer.serving.batcher import Batcher

    batcher = Batcher(lambda: translator, max_wait=0.005, max_pending=64)
    try:
        with in_thread(create_app([loaded], batcher, limits), limits) as url:
            yield url
    finally:
        batcher.close()


def serve(checkpoint: Path, err: Path, *args: str) -> tuple[Proc, str]:
    """`tfm serve` of ``checkpoint`` on a free port of 127.0.0.1 (CPU); returns the process and its URL once
    /health answers."""
    proc = Proc(["serve", "--checkpoint", str(checkpoint), "--port", "0", "--device", "cpu", *args], err)
    proc.wait_for(lambda: SERVING.search(proc.stderr) is not None, "tfm serve to listen")
    url = SERVING.search(proc.stderr).group(1)
    proc.wait_for(lambda: _healthy(url), "tfm serve to answer /health")
    return proc, url


def _healthy(url: str) -> bool:
    try:
        return call(url, "GET", "/health")[0] == 200
    except OSError:
        return False
