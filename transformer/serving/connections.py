"""The connections of ``tfm serve``: how long a client may take to send a request, and how many are held open.

uvicorn times out a connection only while it is idle between two requests, and only until it sends a byte: one that
sends part of a request (``POST /translate HTTP/1.1`` and a header line) and stalls is held for ever, and a few
hundred of those lock every other client out. Here each request has deadlines: its headers within
``Limits.header_timeout_s`` of the connection (or of the answer before), its body within ``Limits.body_timeout_s``
of its headers; past one the connection is closed. And the number held is bounded: a connection beyond
``Limits.max_connections`` closes the one that has owed its request longest (stalled, or idle between requests),
so stalled clients cannot lock the others out; only when every connection waits on the model is the new one
answered 503.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from transformer.serving.checks import Limits

OWING = (h11.IDLE, h11.SEND_BODY)  # the client's states in which the server waits for it, not it for the server


def _busy(limits: Limits) -> bytes:
    """The raw 503 a connection gets when every one already held waits on the model."""
    body = json.dumps(
        {"error": f"the server holds {limits.max_connections} connections, all waiting for answers; retry in a moment"}
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def protocol(limits: Limits) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with request deadlines and a bounded number of connections, as ``limits`` say."""
    timeouts = {h11.IDLE: limits.header_timeout_s, h11.SEND_BODY: limits.body_timeout_s + 1}  # the app's comes first

    class Bounded(H11Protocol):
        """One connection; the deadline of the part of a request it owes is re-armed whenever that part changes."""

        phase: Any = None
        since = 0.0
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._watch()
            if len(self.connections) > limits.max_connections:
                self._make_room()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _watch(self) -> None:
            phase = self.conn.their_state
            if phase is self.phase or self.transport.is_closing():
                return
            self.phase, self.since = phase, time.monotonic()
            self._disarm()
            if phase in timeouts:
                self.deadline = self.loop.call_later(timeouts[phase], self._expire, phase)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expire(self, phase: Any) -> None:
            if self.conn.their_state is phase and not self.transport.is_closing():
                self.transport.close()

        def _make_room(self) -> None:
            """Close the connection that has owed its request longest; with none owing one, refuse this one."""
            owing = [c for c in self.connections if c is not self and getattr(c, "phase", None) in OWING]
            if owing:
                victim = min(owing, key=lambda c: c.since)
                self.connections.discard(victim)
                victim.transport.close()
                return
            self.connections.discard(self)
            self.transport.write(_busy(limits))
            self.transport.close()

    return Bounded


def server_config(app: Any, limits: Limits, **settings: Any) -> uvicorn.Config:
    """uvicorn's settings for ``app``: its connections bounded and timed as ``limits`` say (uvicorn's own
    concurrency limit is off: the protocol enforces the bound)."""
    return uvicorn.Config(
        app, http=protocol(limits), limit_concurrency=None, log_level="warning", access_log=False, **settings
    )
