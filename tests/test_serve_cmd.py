"""`tfm serve` as a user runs it, in a subprocess on 127.0.0.1: under concurrent load every answer equals
`tfm translate`'s and memory stays bounded; SIGTERM and Ctrl-C let the request in flight finish, exit 143 / 130 and
release the port; a port in use, a missing extra or a bad checkpoint is one error line."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from cli_helpers import ENV, one_error_line
from serve_helpers import Client, call, post, serve
from tiny import ROOT, SAMPLE
from typer.testing import CliRunner

from cli.main import app

CLIENTS, REQUESTS = 16, 200


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    lines = (SAMPLE / "valid.de").read_text(encoding="utf-8").splitlines()
    return [lines[i % len(lines)] for i in range(REQUESTS)]


@pytest.fixture(scope="module")
def translated(tiny_run, sentences, tmp_path_factory) -> dict[str, str]:
    """`tfm translate --input` of the same sentences with the same checkpoint: what every answer must equal."""
    folder = tmp_path_factory.mktemp("translate")
    (folder / "in.de").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    args = ["translate", "--checkpoint", str(tiny_run.run_dir / "best"), "--input", str(folder / "in.de")]
    out = subprocess.run(
        [sys.executable, "-m", "cli", *args, "--device", "cpu"], env=ENV, cwd=ROOT, capture_output=True, check=True
    )
    return dict(zip(sentences, out.stdout.decode("utf-8").splitlines()))


def rss_kb(pid: int) -> int:
    status = open(f"/proc/{pid}/status", encoding="utf-8").read()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def load(url: str, sentences: list[str]) -> list[tuple[str, int, object]]:
    """Every sentence as a request of its own, from CLIENTS clients each holding one keep-alive connection."""
    local = threading.local()

    def one(sentence: str) -> tuple[str, int, object]:
        if not hasattr(local, "client"):
            local.client = Client(url)
        status, answer = local.client.post("/translate", {"text": [sentence]})
        return sentence, status, answer

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, sentences))


def test_concurrent_requests_get_tfm_translates_answers_and_memory_stays_bounded(
    tiny_run, sentences, translated, tmp_path
):
    proc, url = serve(tiny_run.run_dir / "best", tmp_path / "serve.err")
    try:
        rss = []
        for _ in range(3):
            answers = load(url, sentences)
            assert [status for _, status, _ in answers] == [200] * REQUESTS
            assert {s: a["translations"][0]["text"] for s, _, a in answers} == translated
            rss.append(rss_kb(proc.p.pid))
        assert rss[2] - rss[0] < 30_000, rss  # kB: the second and third rounds hold nothing of the first
        health = call(url, "GET", "/health")[1]
        assert health["pending"] == 0 and health["chunks"] < 3 * REQUESTS  # requests were joined
    finally:
        proc.p.send_signal(signal.SIGTERM)
        proc.finish()


@pytest.mark.parametrize(
    "signum, code, line", [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_lets_the_request_in_flight_finish_and_releases_the_port(tiny_run, tmp_path, signum, code, line):
    """--max-wait-ms 1000 keeps the request waiting for company in the queue, where /health shows it, when the
    signal comes; it is answered, then the server exits and its port can be bound again."""
    proc, url = serve(tiny_run.run_dir / "best", tmp_path / "serve.err", "--max-wait-ms", "1000")
    port = int(url.rsplit(":", 1)[1])
    answer = {}
    request = threading.Thread(target=lambda: answer.update(r=post(url, "/translate", {"text": ["Ein Mann."]})))
    request.start()
    proc.wait_for(lambda: call(url, "GET", "/health")[1]["pending"] == 1, "the request to wait in the queue")
    proc.p.send_signal(signum)
    request.join(60)
    assert answer["r"][0] == 200 and len(answer["r"][1]["translations"]) == 1
    assert proc.finish() == code
    assert line in proc.stderr and "Traceback" not in proc.stderr
    with socket.socket() as s:  # as tfm serve binds: past the closed connections' TIME_WAIT, not past a listener
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def refused(*args: str) -> str:
    """The one error line of `tfm serve ARGS`, run in this process, which must exit 2 without serving."""
    r = CliRunner().invoke(app, ["serve", *args])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    return one_error_line(r.stderr)


def test_a_port_in_use_is_one_error_line(tiny_run):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = refused("--checkpoint", str(tiny_run.run_dir / "best"), "--port", port)
    assert f"port {port} on 127.0.0.1 is in use" in line


@pytest.mark.parametrize(
    "args, words",
    [
        (["--checkpoint", "nowhere"], "checkpoint 'nowhere' not found"),
        (["--port", "70000"], "--port 70000 is out of range"),
        (["--host", "no such host.invalid"], "--host 'no such host.invalid' cannot be resolved"),
        (["--max-wait-ms", "-1"], "--max-wait-ms -1.0 is out of range"),
        (["--device", "gpu"], "gpu"),
        (["--batch-tokens", "0"], "--batch-tokens 0 is out of range"),
    ],
)
def test_bad_options_are_one_error_line(tiny_run, args, words):
    checkpoint = ["--checkpoint", str(tiny_run.run_dir / "best")] if "--checkpoint" not in args else []
    port = ["--port", "0"] if "--port" not in args else []
    assert words in refused(*checkpoint, *port, *args)


def test_without_the_serve_extra_the_error_names_it(tmp_path):
    code = "import sys; sys.modules['uvicorn'] = None; sys.argv = ['tfm', 'serve']; from cli.main import app; app()"
    out = subprocess.run([sys.executable, "-c", code], env=ENV, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert "pip install starlette uvicorn" in one_error_line(out.stderr)
