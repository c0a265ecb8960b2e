"""``tfm serve``: load a checkpoint, bind the port, serve the API and the page until Ctrl-C or SIGTERM.

uvicorn runs the app (transformer/serving/app.py) in this, the main, thread and turns the first SIGINT or SIGTERM
into a graceful stop: it takes no new connections, lets the requests in flight finish, then returns. The
Batcher's thread is then closed, the port is already released, and the process exits 130 or 143 as other
commands do.
"""

from __future__ import annotations

import errno
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from cli.exits import fail

if TYPE_CHECKING:
    from transformer.decoding.translator import TranslateOptions
    from transformer.serving.checks import Limits

EXTRA = "tfm serve needs starlette and uvicorn (the serve extra); pip install starlette uvicorn"
GRACE_S = 30  # how long requests in flight may take to finish once asked to stop


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port), or one line saying why not."""
    if not 0 <= port <= 65535:
        fail(f"--port {port} is out of range; give 0 to 65535 (0: any free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        fail(f"--host '{host}' cannot be resolved ({e.strerror}); give an address such as 127.0.0.1")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            fail(f"port {port} on {host} is in use; stop what serves there or pass another --port")
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}; pass another --host or --port")
    sock.listen(128)
    return sock


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's exit, once uvicorn has stopped gracefully and raised the signal again."""
    print("stopped by SIGTERM", file=sys.stderr)
    raise SystemExit(128 + signum)


def run_serve(
    checkpoints: list[Path] | None, host: str, port: int, max_wait_ms: float, runs: Path, options: TranslateOptions
) -> None:
    """Serve ``checkpoints`` (one model, or several as an ensemble) on ``host:port`` until stopped; every check comes
    before the models are loaded."""
    try:
        import uvicorn  # noqa: F401 - here, to name the extra before any work

        from transformer.serving.app import create_app
    except ImportError:
        fail(EXTRA)
    from transformer import checkpoint as ckpt
    from transformer.decoding.translator import Translator
    from transformer.serving.batcher import Batcher
    from transformer.serving.checks import Limits

    if not 0 <= max_wait_ms <= 1000:
        fail(f"--max-wait-ms {max_wait_ms} is out of range; give 0 to 1000 (a few ms joins concurrent requests)")
    sock = _bind(host, port)
    try:
        limits = Limits()
        paths = checkpoints or [ckpt.newest(runs)]
        batcher = Batcher(lambda: Translator.from_checkpoint(paths, options), max_wait_ms / 1000, limits.max_pending)
        try:
            served = batcher.translator.members
            app = create_app(served, batcher, limits)
            _serve(app, sock, limits, f"serving {' + '.join(str(m.path) for m in served)} on")
        finally:
            batcher.close()
    finally:
        sock.close()


def _serve(app: Any, sock: socket.socket, limits: Limits, what: str) -> None:
    """Run uvicorn on ``sock`` until a signal stops it, its connections bounded and timed as ``limits`` say; SIGTERM
    then exits 143 (SIGINT is Ctrl-C's KeyboardInterrupt, which the command line turns into 130)."""
    import uvicorn

    from transformer.serving.connections import server_config

    config = server_config(app, limits, timeout_graceful_shutdown=GRACE_S, lifespan="off")
    host, port = sock.getsockname()[:2]
    print(f"{what} http://{host}:{port} (Ctrl-C stops)", file=sys.stderr, flush=True)
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
