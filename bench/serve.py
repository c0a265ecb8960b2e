"""Sentences/s through ``tfm serve`` with 1 and 16 clients against ``tfm translate --input`` on the same sentences.

Each client sends one sentence per request on a keep-alive connection and waits for its answer, as an
application would; the server (one process, started once, warmed up) joins concurrent requests into chunks.
``tfm translate`` is timed as a user runs it on a file, a fresh process; its start-up (the same command on an
empty file) is measured too and taken out, so both figures count translation alone. Systems alternate round by
round, and every server answer is checked against translate's line for the same sentence.

    python -m bench.serve --checkpoint runs/bench_small/best            # 1,000 test_2016_flickr sentences
    python -m bench.serve --checkpoint runs/bench_small/best --quick    # 40 sentences, one round: checks it runs
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import http.client
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import DEFAULT_DATA, ROOT, machine, median
from bench.startup import tfm_command

SERVING = re.compile(r"serving .* on http://([\d.]+):(\d+) ")


class Server:
    """``tfm serve`` of a checkpoint on a free port of 127.0.0.1, read from the line it prints."""

    def __init__(self, checkpoint: Path, err: Path, server_args: list[str]) -> None:
        self.err = err
        with open(err, "w") as f:
            args = [*tfm_command(), "serve", "--checkpoint", str(checkpoint), "--port", "0", "--device", "cpu"]
            args += server_args
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=f)
        while not (found := SERVING.search(err.read_text(encoding="utf-8"))):
            if self.proc.poll() is not None:
                raise RuntimeError(f"tfm serve exited: {err.read_text(encoding='utf-8')}")
            time.sleep(0.1)
        self.host, self.port = found.group(1), int(found.group(2))

    def translate(self, sentences: list[str], clients: int) -> tuple[float, list[str]]:
        """Seconds to get every sentence translated, one request each, from ``clients`` concurrent clients."""
        local = threading.local()

        def one(sentence: str) -> str:
            if not hasattr(local, "conn"):
                local.conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
            local.conn.request("POST", "/translate", json.dumps({"text": [sentence]}).encode("utf-8"))
            response = local.conn.getresponse()
            answer = json.loads(response.read())
            if response.status != 200:
                raise RuntimeError(f"tfm serve answered {response.status}: {answer}")
            return answer["translations"][0]["text"]

        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            out = list(pool.map(one, sentences))
        return time.perf_counter() - start, out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def translate_file(checkpoint: Path, path: Path) -> tuple[float, list[str]]:
    """Wall seconds of ``tfm translate --input path`` in a fresh process, and its lines."""
    args = [*tfm_command(), "translate", "--checkpoint", str(checkpoint), "--input", str(path), "--device", "cpu"]
    start = time.perf_counter()
    out = subprocess.run(args, cwd=ROOT, capture_output=True, check=True)
    return time.perf_counter() - start, out.stdout.decode("utf-8").splitlines()


def measure(
    checkpoint: Path, sentences: list[str], clients: list[int], rounds: int, work: Path, server_args: list[str]
) -> dict:
    """Each system's sentences/s (medians of ``rounds``), the seconds of every round (a shared machine's load shows
    there), and how many server answers differ from translate's lines."""
    text, empty = work / "input.de", work / "empty.de"
    text.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    empty.write_text("", encoding="utf-8")
    server = Server(checkpoint, work / "serve.err", server_args)
    try:
        server.translate(sentences[:16], 16)  # warm-up: first allocations, oneDNN's kernels
        names = ["translate", *[f"serve_{c}" for c in clients]]
        seconds: dict[str, list[float]] = {n: [] for n in ["translate_startup", *names]}
        expected: list[str] = []
        differ = 0
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                if name == "translate":
                    seconds["translate_startup"].append(translate_file(checkpoint, empty)[0])
                    took, expected = translate_file(checkpoint, text)
                else:
                    took, got = server.translate(sentences, int(name.split("_")[1]))
                    differ += sum(a != b for a, b in zip(got, expected)) if expected else 0
                seconds[name].append(took)
    finally:
        server.stop()
    startup = median(seconds["translate_startup"])
    n = len(sentences)
    figures = {"sentences": n, "rounds": rounds, "translate_startup_s": round(startup, 2)}
    translating = median(seconds["translate"]) - startup  # None below: lost in the noise of start-up (--quick)
    figures["translate_sentences_per_s"] = round(n / translating, 1) if translating > 0 else None
    figures["translate_with_startup_sentences_per_s"] = round(n / median(seconds["translate"]), 1)
    for c in clients:
        figures[f"serve_{c}_clients_sentences_per_s"] = round(n / median(seconds[f"serve_{c}"]), 1)
    figures["server_answers_unlike_translate"] = differ
    figures["seconds_by_round"] = {name: [round(x, 2) for x in xs] for name, xs in seconds.items()}
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--data", default=DEFAULT_DATA, help="Multi30k folder (test_2016_flickr.<src>.gz)")
    parser.add_argument("--src", default="de")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--clients", default="1,16", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "runs" / "serve.json")
    parser.add_argument("--quick", action="store_true", help="40 sentences, one round")
    parser.add_argument("--max-wait-ms", type=float, help="the server's --max-wait-ms (default: tfm serve's)")
    args = parser.parse_args(argv)
    n, rounds = (40, 1) if args.quick else (args.sentences, args.rounds)
    with gzip.open(Path(args.data) / f"test_2016_flickr.{args.src}.gz", "rt", encoding="utf-8") as f:
        sentences = f.read().splitlines()[:n]
    with tempfile.TemporaryDirectory() as work:
        server_args = [] if args.max_wait_ms is None else ["--max-wait-ms", str(args.max_wait_ms)]
        clients = [int(c) for c in args.clients.split(",")]
        figures = measure(args.checkpoint, sentences, clients, rounds, Path(work), server_args)
    details = machine()
    record = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{details['cpu']}, {details['cores']} cores",
        "command": "python -m bench.serve " + " ".join(sys.argv[1:] if argv is None else argv),
        "figures": figures,
        "details": details,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
