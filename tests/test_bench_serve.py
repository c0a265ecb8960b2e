"""bench.serve --quick runs end to end with the tiny checkpoint: every figure is there, and every server answer
equals tfm translate's line for the same sentence."""

import gzip
import json
from pathlib import Path

from tiny import SAMPLE

from bench import serve


def test_serve_bench_quick_writes_its_record(tiny_run, tmp_path: Path) -> None:
    """The tiny model has 64 positions, too few for Multi30k's long lines under its sample-trained tokenizer: the
    sample's sentences stand in for test_2016_flickr."""
    data = tmp_path / "data"
    data.mkdir()
    with gzip.open(data / "test_2016_flickr.de.gz", "wt", encoding="utf-8") as f:
        f.write((SAMPLE / "valid.de").read_text(encoding="utf-8"))
    out = tmp_path / "serve.json"
    args = ["--checkpoint", str(tiny_run.run_dir / "best"), "--data", str(data), "--json", str(out)]
    serve.main([*args, "--quick", "--clients", "1,4"])
    record = json.loads(out.read_text(encoding="utf-8"))
    assert set(record) == {"date", "machine", "command", "figures", "details"}
    assert record["machine"] and "--quick" in record["command"]
    figures = record["figures"]
    assert figures["sentences"] == 40 and figures["server_answers_unlike_translate"] == 0
    for key in ("translate_with_startup_sentences_per_s", "serve_1_clients_sentences_per_s"):
        assert figures[key] > 0, key
    assert figures["serve_4_clients_sentences_per_s"] > 0
    assert figures["translate_sentences_per_s"] is None or figures["translate_sentences_per_s"] > 0
