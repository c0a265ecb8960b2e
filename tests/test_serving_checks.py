"""Request checks of tfm serve: each bad body is refused with its status and one line, good ones become settings."""

from __future__ import annotations

import json

import pytest

from transformer.config import DecodeConfig
from transformer.serving.checks import Limits, RequestError, check_attention, check_translate, read_json

LIMITS = Limits(max_sentences=4, max_beam=8)
DECODE = DecodeConfig(beam=4, alpha=0.6)


def refused(call, *args) -> RequestError:
    with pytest.raises(RequestError) as e:
        call(*args)
    assert "\n" not in str(e.value)
    return e.value


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"", 400, "empty"),
        (b"  \n", 400, "empty"),
        (b'{"text": ["\xff"]}', 400, "UTF-8"),
        (b"{bad", 400, "not valid JSON"),
        (b"[" * 100_000, 400, "nested too deeply"),
        (b'["Ein Mann."]', 400, "not an object"),
        (b'"text"', 400, "not an object"),
    ],
)
def test_bodies_that_are_not_a_json_object_are_refused(body, status, words):
    e = refused(read_json, body)
    assert e.status == status and words in str(e)


def test_a_json_object_is_read():
    assert read_json('{"text": ["Ein Mann."], "beam": 2}'.encode()) == {"text": ["Ein Mann."], "beam": 2}


@pytest.mark.parametrize(
    "obj, status, words",
    [
        ({}, 400, "'text' is missing"),
        ({"text": "Ein Mann."}, 400, "list of strings"),
        ({"text": ["a", 1]}, 400, "list of strings"),
        ({"text": None}, 400, "list of strings"),
        ({"text": ["a"], "n_best": 2}, 400, "unknown key 'n_best'"),
        ({"text": ["a"] * 5}, 413, "at most 4"),
        ({"text": ["a"], "beam": "5"}, 400, "beam must be an integer"),
        ({"text": ["a"], "beam": 2.0}, 400, "beam must be an integer"),
        ({"text": ["a"], "beam": True}, 400, "beam must be an integer"),
        ({"text": ["a"], "beam": 0}, 422, "1 to 8"),
        ({"text": ["a"], "beam": 9}, 422, "1 to 8"),
        ({"text": ["a"], "beam": 2, "nbest": 3}, 422, "nbest 3 is out of range"),
        ({"text": ["a"], "nbest": 0}, 422, "nbest 0"),
        ({"text": ["a"], "alpha": -1}, 422, "alpha -1"),
        ({"text": ["a"], "alpha": float("nan")}, 422, "alpha nan"),
        ({"text": ["a"], "alpha": "0.6"}, 400, "alpha must be a number"),
        ({"text": ["a", "Mann " * 70]}, 422, "sentence 2"),
        ({"text": ["a"], "sample": 1}, 400, "sample must be true or false"),
        ({"text": ["a"], "sample": True, "beam": 3}, 422, "sampling draws tokens and a beam of 3"),
        ({"text": ["a"], "sample": True, "temperature": 0}, 422, "temperature 0 is out of range"),
        ({"text": ["a"], "sample": True, "temperature": "hot"}, 400, "temperature must be a number"),
        ({"text": ["a"], "sample": True, "top_p": 1.5}, 422, "top_p 1.5 is out of range"),
        ({"text": ["a"], "sample": True, "top_p": 0}, 422, "top_p 0 is out of range"),
        ({"text": ["a"], "sample": True, "top_k": 100_000}, 422, "larger than the model's vocabulary"),
        ({"text": ["a"], "sample": True, "top_k": 2.5}, 400, "top_k must be an integer"),
        ({"text": ["a"], "sample": True, "seed": -1}, 422, "seed -1 is out of range"),
        ({"text": ["a"], "sample": True, "nbest": 9}, 422, "nbest 9 is out of range"),
        ({"text": ["a"], "align": "yes"}, 400, "align must be true or false"),
    ],
)
def test_translate_requests_out_of_type_or_range_are_refused(sample_tokenizer, obj, status, words):
    e = refused(check_translate, obj, LIMITS, sample_tokenizer, 64, DECODE)
    assert e.status == status and words in str(e), str(e)


def test_a_beam_wider_than_the_vocabulary_is_refused(sample_tokenizer):
    limits = Limits(max_beam=10**6)
    e = refused(check_translate, {"text": ["a"], "beam": 1001}, limits, sample_tokenizer, 64, DECODE)
    assert e.status == 422 and "1 to 1000" in str(e)


def test_a_good_request_gets_its_settings_and_the_checkpoints_defaults(sample_tokenizer):
    req = check_translate({"text": ["Ein Mann.", ""], "nbest": 2}, LIMITS, sample_tokenizer, 64, DECODE)
    assert req.lines == ["Ein Mann.", ""]
    assert req.lengths == [len(sample_tokenizer.encode("Ein Mann.")), 0]
    assert (req.decode.beam, req.decode.nbest, req.decode.alpha) == (4, 2, 0.6)
    req = check_translate({"text": [], "beam": 1, "alpha": 0}, LIMITS, sample_tokenizer, 64, DECODE)
    assert (req.lines, req.decode.beam, req.decode.alpha) == ([], 1, 0.0)


def test_the_position_rule_is_the_translators(sample_tokenizer):
    """A line fits when its tokens and <END> fit the positions: exactly ``max_positions - 1`` tokens pass."""
    line = "Mann " * 30
    n = len(sample_tokenizer.encode(line.strip()))
    assert check_translate({"text": [line]}, LIMITS, sample_tokenizer, n + 1, DECODE).lengths == [n]
    assert refused(check_translate, {"text": [line]}, LIMITS, sample_tokenizer, n, DECODE).status == 422


def test_a_lowercased_models_lines_are_measured_lowercased(sample_tokenizer):
    """The server counts the tokens the Translator will encode: for a model trained on lowercased text, those of the
    lowercased line, so the position rule refuses what the model would not fit and nothing else."""
    line = "DER MANN FÄHRT MIT DEM FAHRRAD."
    cased, lower = len(sample_tokenizer.encode(line)), len(sample_tokenizer.encode(line.lower()))
    assert cased != lower
    req = check_translate({"text": [line]}, LIMITS, sample_tokenizer, lower + 1, DECODE, lowercase=True)
    assert req.lengths == [lower]
    assert refused(check_translate, {"text": [line]}, LIMITS, sample_tokenizer, lower, DECODE, True).status == 422
    assert check_attention({"text": line}, sample_tokenizer, lower + 1, 2, lowercase=True).text == line


@pytest.mark.parametrize(
    "obj, status, words",
    [
        ({"text": ["a"]}, 400, "one sentence as a string"),
        ({"text": " \t"}, 422, "empty"),
        ({"text": "a", "layer": 0}, 422, "1 to 2"),
        ({"text": "a", "layer": 3}, 422, "1 to 2"),
        ({"text": "a", "layer": "2"}, 400, "layer must be an integer"),
        ({"text": "a", "head": 1}, 400, "unknown key 'head'"),
    ],
)
def test_attention_requests_out_of_type_or_range_are_refused(sample_tokenizer, obj, status, words):
    e = refused(check_attention, obj, sample_tokenizer, 64, 2)
    assert e.status == status and words in str(e), str(e)


def test_attention_defaults_to_the_last_layer(sample_tokenizer):
    assert check_attention(json.loads('{"text": "Ein Mann."}'), sample_tokenizer, 64, 2).layer == 2


def test_a_huge_integer_is_not_echoed_back_whole(sample_tokenizer):
    """A number of thousands of digits (past what Python reads from text) and one of hundreds: the answer is one
    short line either way."""
    with pytest.raises(RequestError, match="has thousands of digits") as e:
        read_json(b'{"text": ["a"], "beam": ' + b"9" * 5000 + b"}")
    assert len(str(e.value)) < 120
    for key in ("beam", "nbest", "alpha"):
        obj = read_json(b'{"text": ["a"], "%s": ' % key.encode() + b"9" * 400 + b"}")
        with pytest.raises(RequestError) as e:
            check_translate(obj, Limits(), sample_tokenizer, 100, DecodeConfig())
        assert e.value.status == 422 and "999999999999..." in str(e.value) and len(str(e.value)) < 160
