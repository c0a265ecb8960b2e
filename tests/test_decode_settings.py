"""The settings a decode takes exist once, as DecodeConfig's fields: every decoding flag of the command line is a
parameter named after one (and goes to the Translator by that name alone), and every key a request may set is one."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main
from cli_helpers import one_error_line
from typer.testing import CliRunner

from cli.decode_flags import flag
from cli.main import app
from transformer.config import RANGES, DecodeConfig
from transformer.serving.checks import REQUEST, Limits, RequestError, check_translate

FIELDS = {f.name for f in dataclasses.fields(DecodeConfig)}
# What a decoding command takes that is not a decode setting: where to read and write, which model, how to run it.
OTHER = {
    "text",
    "checkpoint",
    "input_",
    "output",
    "greedy",
    "align",
    "prefix",
    "prefix_file",
    "device",
    "precision",
    "runs",
    "overwrite",
    "split",
    "src",
    "ref",
    "hyp",
    "data_dir",
    "output_dir",
    "from_",
    "host",
    "port",
    "max_wait_ms",
    "format_",
    "tokens",
    "tgt",
}


def test_every_decoding_flag_is_a_decode_setting_by_name():
    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}
    for name in ("translate", "eval", "serve", "score"):
        params = {p.name for p in commands[name].params}
        assert params - FIELDS <= OTHER, (name, params - FIELDS - OTHER)
        assert params & FIELDS, name
    assert {p.name for p in commands["translate"].params} >= REQUEST_FLAGS


@pytest.mark.parametrize("command", ["translate", "eval", "serve", "score", "attention"])
def test_a_decode_settings_flag_is_its_fields_name_held_to_its_range(command):
    """``--top-k`` for ``top_k`` (a second spelling may follow), and a value below the field's range in RANGES is
    refused in one line naming the flag, before any model is looked for."""
    params = [p for p in typer.main.get_command(app).commands[command].params if p.name in FIELDS]
    assert params, command
    for p in params:
        assert p.opts[0] == flag(p.name), (command, p.opts)
        if f"decode.{p.name}" in RANGES:
            r = CliRunner().invoke(
                app, [command, *(["a"] if command == "attention" else []), p.opts[0], str(-(10**13))]
            )
            line = one_error_line(r.stderr)
            assert r.exit_code == 2 and line.startswith(f"error: {p.opts[0]} -1") and "out of range" in line, r.output


REQUEST_FLAGS = {"beam", "nbest", "alpha", "to", "sample", "temperature", "top_k", "top_p", "seed", "align_layer"}


def test_every_key_a_request_may_set_is_a_decode_setting(sample_tokenizer):
    assert set(REQUEST) <= FIELDS
    for key in REQUEST:
        value = {"beam": 1, "nbest": 1, "alpha": 1.0, "to": None, "sample": True, "seed": 3}.get(key, 1)
        try:
            req = check_translate({"text": ["a"], key: value}, Limits(), sample_tokenizer, 64, DecodeConfig())
        except RequestError as e:
            assert "unknown key" not in str(e), key
        else:
            assert getattr(req.decode, key) == value or key == "to", key
    with pytest.raises(RequestError) as e:
        check_translate({"text": ["a"], "beam_size": 2}, Limits(), sample_tokenizer, 64, DecodeConfig())
    assert "unknown key 'beam_size'" in str(e.value)
    keys = set(str(e.value).split("the keys are ")[1].split(", "))
    assert keys - {"text", "align"} == set(REQUEST), keys  # the text, whether to align, and the settings REQUEST names
