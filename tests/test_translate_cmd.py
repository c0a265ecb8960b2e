"""`tfm translate` (cli/translate_cmd.py): one output line per input line whatever the bytes, Ctrl-C keeps complete
lines.

Bad input goes through the real Typer app in-process (``CliRunner``), the same code as the command line
minus the interpreter start-up; Ctrl-C is a real SIGINT sent to a `python -m cli translate` subprocess.
"""

import os
import re
import signal
import subprocess

import pytest
from cli_helpers import Proc, one_error_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from cli.translate_cmd import run_translate
from transformer.decoding.translator import TranslateOptions, Translator

SENTENCE = "Ein Mann fährt Fahrrad."


def _translate(ckpt, *args: str):
    return CliRunner().invoke(app, ["translate", "--checkpoint", str(ckpt), "--device", "cpu", "--greedy", *args])


def test_ctrl_c_during_translate_output_leaves_only_complete_lines(tiny_checkpoint, tmp_path):
    """Lines come from a pipe left open, so translation cannot end before the SIGINT, however fast it runs."""
    out, fed = tmp_path / "out.en", 2000
    proc = Proc(
        ["translate", "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--greedy", "--output", str(out)],
        tmp_path / "translate.err",
        stdin=subprocess.PIPE,
    )
    proc.p.stdin.write(f"{SENTENCE}\n".encode() * fed)
    proc.p.stdin.flush()
    proc.wait_for(lambda: out.is_file() and out.stat().st_size > 0, "the first translations")
    proc.p.send_signal(signal.SIGINT)
    assert proc.finish() == 130, proc.stderr
    proc.p.stdin.close()
    written = int(re.search(r"interrupted: (\d+) complete lines written", proc.stderr).group(1))
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n") and 0 < written <= fed and text.count("\n") == written
    translator = Translator.from_checkpoint(tiny_checkpoint, TranslateOptions("cpu", beam=1))
    expected = {t.best for t in translator.translate_chunk([SENTENCE] * 1000)}
    assert set(text.splitlines()) <= expected


def test_invalid_utf8_is_replaced_with_a_warning_naming_the_line(tiny_checkpoint, tmp_path):
    src, out = tmp_path / "in.de", tmp_path / "out.en"
    src.write_bytes(b"Ein Hund.\n\xff\xfe kaputt \xc3\n\nDie Frau.\n")
    r = _translate(tiny_checkpoint, "--input", str(src), "--output", str(out))
    assert r.exit_code == 0, r.output
    assert f"warning: {src} line 2: invalid UTF-8 replaced by U+FFFD" in r.stderr
    assert "line 1" not in r.stderr and "line 4" not in r.stderr
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[2] == "" and lines[4] == ""


def test_invalid_utf8_in_the_sentence_argument_is_replaced_not_a_crash(tiny_checkpoint):
    r = _translate(tiny_checkpoint, os.fsdecode(b"Ein \xff Hund."))  # how Python hands over non-UTF-8 argv bytes
    assert r.exit_code == 0, r.output
    assert "invalid UTF-8 replaced by U+FFFD" in r.stderr and len(r.stdout.splitlines()) == 1


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_empty_input_gives_empty_output_and_exit_0(tiny_checkpoint, tmp_path, content):
    src, out = tmp_path / "in.de", tmp_path / "out.en"
    src.write_bytes(content)
    r = _translate(tiny_checkpoint, "--input", str(src), "--output", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == b"\n" * content.count(b"\n")
    assert ("note: the input was empty" in r.stderr) == (content == b"")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.binary(max_size=25), st.text(max_size=25).map(lambda s: s.encode("utf-8"))), max_size=6))
def test_any_bytes_file_gives_one_output_line_per_input_line(tiny_checkpoint, tmp_path, rows):
    """Arbitrary bytes (invalid UTF-8, NUL, CR, U+2028, BOM...) split only on b'\\n': one output line each."""
    rows = [row.replace(b"\n", b" ") for row in rows]
    src, out = tmp_path / "in.bin", tmp_path / "out.txt"
    src.write_bytes(b"".join(row + b"\n" for row in rows))
    out.unlink(missing_ok=True)  # hypothesis runs every example in the same tmp_path
    run_translate(None, [tiny_checkpoint], src, out, tmp_path, False, TranslateOptions("cpu", beam=1, nbest=1))
    assert out.read_text(encoding="utf-8").count("\n") == len(rows)


def test_alpha_sets_the_length_penalty_of_nbest_scores(tiny_checkpoint):
    """Scores are log-probabilities divided by ((5 + len) / 6) ** alpha: alpha 0 leaves them raw, alpha 2 shrinks
    them."""

    def scores(alpha: str) -> list[float]:
        r = CliRunner().invoke(
            app,
            [
                "translate",
                SENTENCE,
                "--checkpoint",
                str(tiny_checkpoint),
                "--device",
                "cpu",
                "--beam",
                "4",
                "--nbest",
                "4",
                "--alpha",
                alpha,
            ],
        )
        assert r.exit_code == 0, r.output
        return [float(line.split(" ||| ")[2]) for line in r.stdout.splitlines()]

    raw, penalised = scores("0"), scores("2")
    assert raw != penalised and max(raw) < 0 and min(penalised) > min(raw)


@pytest.mark.parametrize("alpha", ["nan", "inf", "-1", "1000", "1e+308"])
def test_a_length_penalty_out_of_its_finite_range_is_one_line(tiny_checkpoint, alpha):
    r = _translate(tiny_checkpoint, SENTENCE, "--alpha", alpha)
    assert r.exit_code == 2 and f"--alpha {alpha} is out of range; it must be 0 to 10" in one_error_line(r.stderr)


def test_int8_translates_a_file_line_for_line(tiny_checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(f"{SENTENCE}\n\nDer Hund läuft.\n", encoding="utf-8")
    r = _translate(tiny_checkpoint, "--input", str(src), "--precision", "int8")
    assert r.exit_code == 0 and len(r.stdout.split("\n")) == 4 and r.stdout.split("\n")[1] == ""
