"""Decoding beyond the best translation through the command line: sampling, alignments, forced prefixes and tfm score,
and what a bad setting gets: one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import one_error_line
from typer.testing import CliRunner

from cli.main import app

LINES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]


def tfm(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {"src": tmp_path / "in.de", "tgt": tmp_path / "out.en", "prefixes": tmp_path / "prefixes.en"}
    paths["src"].write_text("\n".join(LINES) + "\n", encoding="utf-8")
    paths["tgt"].write_text("A man rides a bike.\nTwo dogs play in the snow.\n", encoding="utf-8")
    paths["prefixes"].write_text("A man\nTwo\n", encoding="utf-8")
    return paths


def test_samples_alignments_and_prefixes(tiny_run, files, tmp_path):
    best = str(tiny_run.run_dir / "best")
    r = tfm("translate", "--checkpoint", best, "--input", files["src"], "--sample", "--nbest", "3", "--seed", "2")
    assert r.exit_code == 0, r.output
    rows = [line.split(" ||| ") for line in r.stdout.split("\n")[:-1]]
    assert [int(row[0]) for row in rows] == [1, 1, 1, 2, 2, 2]
    scores = [float(row[2]) for row in rows[:3]]
    assert scores == sorted(scores, reverse=True)
    assert (
        tfm(
            "translate", "--checkpoint", best, "--input", files["src"], "--sample", "--nbest", "3", "--seed", "2"
        ).stdout
        == r.stdout
    )
    r = tfm("translate", "--checkpoint", best, "--input", files["src"], "--greedy", "--align")
    for line in r.stdout.split("\n")[:-1]:  # a tiny model's text may hold any character but a newline
        text, links = line.rsplit(" ||| ", 1)
        assert all(p.count("-") == 1 and all(x.isdigit() for x in p.split("-")) for p in links.split())
    r = tfm("translate", "--checkpoint", best, "--input", files["src"], "--prefix-file", files["prefixes"])
    assert r.exit_code == 0 and [line[:3] for line in r.stdout.split("\n")[:-1]] == ["A m", "Two"], r.output


def test_tfm_score_writes_a_line_a_pair(tiny_run, files, tmp_path):
    best = str(tiny_run.run_dir / "best")
    out = tmp_path / "scores.jsonl"
    r = tfm(
        "score",
        "--checkpoint",
        best,
        "--src",
        files["src"],
        "--tgt",
        files["tgt"],
        "--format",
        "jsonl",
        "--tokens",
        "-o",
        out,
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n")[:-1]]
    assert [row["line"] for row in rows] == [1, 2]
    assert all(len(row["token_log_probs"]) == len(row["tokens"]) + 1 and row["log_prob"] < 0 for row in rows)
    r = tfm("score", "--checkpoint", best, "--src", files["src"], "--tgt", files["tgt"])
    assert [len(line.split("\t")) for line in r.stdout.split("\n")[:-1]] == [4, 4]


def test_a_shortlist_counted_from_the_training_split_translates(tiny_run, files, tmp_path):
    best = tiny_run.run_dir / "best"
    shortlist = tmp_path / "shortlist.safetensors"
    r = tfm("shortlist", "--checkpoint", best, "--output", shortlist, "--per-token", "20", "--frequent", "30")
    assert r.exit_code == 0 and "20 target tokens per source token" in r.stderr, r.output
    r = tfm("translate", "--checkpoint", best, "--input", files["src"], "--shortlist", shortlist, "--greedy")
    assert r.exit_code == 0 and len(r.stdout.split("\n")[:-1]) == len(LINES), r.output
    r = tfm("shortlist", "--checkpoint", best, "--output", shortlist)
    assert r.exit_code == 2 and "exists; pass --overwrite" in one_error_line(r.stderr)


@pytest.mark.parametrize(
    "args, words",
    [
        (["translate", "--sample", "--beam", "3"], "sampling draws tokens and a beam of 3 searches them"),
        (["translate", "--sample", "--temperature", "0"], "--temperature 0 is out of range"),
        (["translate", "--sample", "--temperature", "-1"], "--temperature -1 is out of range"),
        (["translate", "--sample", "--top-p", "0"], "--top-p 0 is out of range"),
        (["translate", "--sample", "--top-p", "1.5"], "--top-p 1.5 is out of range"),
        (["translate", "--sample", "--top-k", "100000"], "top-k 100000 is larger than the model's vocabulary"),
        (["translate", "--prefix", "Ein " * 60], "the prefix is"),
        (["translate", "--prefix-file", "{prefixes_short}"], "has 1 lines and the input 2"),
        (["score", "--tgt", "{tgt_short}"], "has 2 lines and --tgt"),
        (["score", "--tgt", "{tgt_empty}"], "line 2: the target is empty"),
        (["score", "--tgt", "{tgt_long}"], "line 1: the target is"),
        (["score", "--tgt", "{tgt_two}", "--src", "{src_gap}"], "line 2: the source is empty"),
        (["score", "--tgt", "{tgt_two}", "--format", "csv"], "--format takes tsv or jsonl, not 'csv'"),
        (["translate", "--prefix", "A", "--prefix-file", "{prefixes_short}"], "give one of them"),
        (["translate", "--shortlist", "{missing}"], "does not exist; make one with tfm shortlist"),
        (["shortlist"], "--src and --tgt go together"),
    ],
)
def test_bad_decoding_input_is_one_line_and_writes_nothing(tiny_run, files, tmp_path, args, words):
    (tmp_path / "prefixes_short").write_text("A man\n", encoding="utf-8")
    (tmp_path / "tgt_short").write_text("A man.\n", encoding="utf-8")
    (tmp_path / "tgt_empty").write_text("A man.\n\n", encoding="utf-8")
    (tmp_path / "tgt_long").write_text("man " * 80 + "\nTwo.\n", encoding="utf-8")
    (tmp_path / "tgt_two").write_text("A man.\nTwo.\n", encoding="utf-8")
    (tmp_path / "src_gap").write_text("Ein Mann.\n\n", encoding="utf-8")
    args = [str(tmp_path / a[1:-1]) if a.startswith("{") else a for a in args]
    out = tmp_path / "written"
    inputs = ["--input", files["src"]] if args[0] == "translate" else ["--src", files["src"]]
    inputs = [] if "--src" in args else inputs
    r = tfm(args[0], "--checkpoint", tiny_run.run_dir / "best", *inputs, *args[1:], "-o", out)
    assert r.exit_code == 2 and words in one_error_line(r.stderr), r.output
    assert not out.exists()


@pytest.mark.parametrize(
    "prefixes, written, words",
    [("A man\nTwo\nThree\n", 2, "has 3 lines and the input 2"), ("A man\n", 0, "the prefixes end at line 1")],
)
def test_a_prefix_file_beside_stdin_of_another_length_is_refused_keeping_what_was_translated(
    tiny_run, tmp_path, prefixes, written, words
):
    """stdin's lines are counted as they are read: too few prefixes stop the chunk that runs out of them, before it is
    written; too many are found at stdin's end, its translations written."""
    (tmp_path / "p.en").write_text(prefixes, encoding="utf-8")
    r = CliRunner().invoke(
        app,
        ["translate", "--checkpoint", str(tiny_run.run_dir / "best"), "--prefix-file", str(tmp_path / "p.en")],
        input="\n".join(LINES) + "\n",
    )
    assert r.exit_code == 2 and words in one_error_line(r.stderr), r.output
    assert len(r.stdout.split("\n")[:-1]) == written  # a tiny model's text may hold any character but a newline
