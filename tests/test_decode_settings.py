"""The settings a decode takes exist once, as DecodeConfig's fields: every decoding flag of the command line is a
parameter named after one (and goes to the Translator by that name alone), and every key a request may set is one."""

from __future__ import annotations

import dataclasses

import typer.main

from cli.main import app
from transformer.config import REQUEST, DecodeConfig
from transformer.serving.checks import Limits, RequestError, check_translate

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
    try:
        check_translate({"text": ["a"], "beam_size": 2}, Limits(), sample_tokenizer, 64, DecodeConfig())
    except RequestError as e:
        assert "unknown key 'beam_size'" in str(e)
